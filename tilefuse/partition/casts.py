"""Widening casts move into the kernels that read them: the narrow value crosses memory.

``v = Cast(u)`` where every value of u's dtype is exact in v's dtype (fp16 -> fp32,
int8 -> int32, ...) carries nothing ``u`` does not. When a group writes ``v`` for other
kernels, it can write ``u`` instead and each reading kernel cast on load: half the bytes
on both sides for fp16 -> fp32. fp16 BERT is the case in point: the product's epilogue
casts the residual sum to fp32 for the LayerNorm, and the norm kernel, memory-bound,
reads that fp32 tensor three times.

A partition covers each node exactly once, so a cast computed in several kernels is
several nodes: each reading group gets its own copy of the Cast node (same primitive,
same input, a new output value its members read). The original stays in its group when
members there read it too, and leaves the graph otherwise. Graph outputs and values an
opaque (host) step reads keep their cast where it is.

The move is a rewrite of the groups (node lists in a topological order of groups) and
of the graph, in place, after grouping and before the verifier. Each move must keep the
reading groups structurally legal (the fusion rules, the size cap) and must
lower the modelled time of the groups it touches; otherwise it is undone.
"""
from __future__ import annotations

from typing import Callable, Sequence

from tilefuse.ir.dtypes import widens_exactly
from tilefuse.ir.graph import Graph, Node, Value
from tilefuse.ir.prims import Map, ScalarFn
from tilefuse.partition.cost import Cost
from tilefuse.partition.kinds import FusionKind, fusion_kind
from tilefuse.partition.rules import structure_problem
from tilefuse.target import Target

CostFn = Callable[[list[Node]], Cost]


def sink_widening_casts(graph: Graph, groups: list[list[Node]], target: Target, cost: CostFn) -> list[Node]:
    """Move each widening cast that a group writes into the groups that read it.

    ``groups`` are node lists in graph order, the groups in a topological order; both
    they and ``graph`` are rewritten in place (group order and count do not change).
    ``cost`` prices a group's nodes. Returns the copies that repeat a computation
    another node also does (one fewer than the copies when the original left the graph).
    """
    mover = _Mover(graph, groups, target, cost)
    for cast in [n for n in graph.nodes if _widening(n)]:
        mover.move(cast)
    return mover.recomputed


def _widening(node: Node) -> bool:
    op = node.op
    return (
        isinstance(op, Map) and op.fn is ScalarFn.CAST and op.to is not None
        and widens_exactly(node.inputs[0].type.dtype, op.to)
    )


class _Mover:
    """The groups, who owns which node, and the moves made so far."""

    def __init__(self, graph: Graph, groups: list[list[Node]], target: Target, cost: CostFn) -> None:
        self.graph = graph
        self.groups = groups
        self.target = target
        self.cost = cost
        self.written = frozenset(id(v) for v in graph.outputs.values())
        self.owner = {id(n): i for i, nodes in enumerate(groups) for n in nodes}
        self.names = {v.name for v in graph.values()} | {n.name for n in graph.nodes}
        self.recomputed: list[Node] = []

    def move(self, cast: Node) -> None:
        readers = self._readers(cast)
        if readers is None:
            return
        home = self.owner[id(cast)]
        touched = [home, *readers]
        before = sum(self.cost(self.groups[i]).seconds(self.target) for i in touched)
        saved = self._save(cast, touched)
        copies = self._rewrite(cast, readers)
        if not self._acceptable(readers, touched, before):
            self._restore(saved, copies)
            return
        for copy, g in zip(copies, readers):
            self.owner[id(copy)] = g
        kept = bool(cast.outputs[0].users)  # read in its own group still
        if not kept:
            del self.owner[id(cast)]
        self.recomputed += copies if kept else copies[1:]

    def _readers(self, cast: Node) -> dict[int, list[Node]] | None:
        """The groups other than its own that read the cast's result, with their reading
        nodes; None unless the cast is worth moving and every reader can take it."""
        u, v = cast.inputs[0], cast.outputs[0]
        home = self.owner[id(cast)]
        if id(v) in self.written or u.producer is None or self.owner.get(id(u.producer)) != home:
            return None  # a graph output keeps its dtype; a cast of a read value saves no write
        readers: dict[int, list[Node]] = {}
        for user in dict.fromkeys(v.users):
            g = self.owner[id(user)]
            if g != home:
                readers.setdefault(g, []).append(user)
        if not readers or any(fusion_kind(n) is FusionKind.OPAQUE for g in readers for n in self.groups[g]):
            return None
        return readers

    def _rewrite(self, cast: Node, readers: dict[int, list[Node]]) -> list[Node]:
        """One copy of ``cast`` per reading group, its members rewired to read the copy;
        the original leaves its group and the graph when nothing reads it any more."""
        u, v = cast.inputs[0], cast.outputs[0]
        at = self.graph.nodes.index(cast) + 1
        copies = []
        for g, users in readers.items():
            copy = Node(cast.op, (u,), (), self._fresh(f"{cast.name}@k{g}"), cast.origin)
            reads = [user for user in users for x in user.inputs if x is v]  # one entry per use, as built
            copy.outputs = (Value(self._fresh(f"{v.name}@k{g}"), v.type, producer=copy, users=reads),)
            u.users.append(copy)
            for user in users:
                user.inputs = tuple(copy.outputs[0] if x is v else x for x in user.inputs)
            v.users[:] = [x for x in v.users if x not in users]
            self.graph.nodes.insert(at, copy)
            copies.append(copy)
        if not v.users:
            u.users[:] = [x for x in u.users if x is not cast]
            self.graph.nodes.remove(cast)
            self.groups[self.owner[id(cast)]].remove(cast)
        pos = {id(n): i for i, n in enumerate(self.graph.nodes)}
        for copy, g in zip(copies, readers):
            self.groups[g] = sorted([*self.groups[g], copy], key=lambda n: pos[id(n)])
        return copies

    def _acceptable(self, readers: dict[int, list[Node]], touched: Sequence[int], before: float) -> bool:
        cap = self.target.partition.max_group_nodes
        for g in readers:
            nodes = self.groups[g]
            if len(nodes) > cap or structure_problem(nodes, self.target, self.written):
                return False
        after = sum(self.cost(self.groups[i]).seconds(self.target) for i in touched)
        return after < before

    # -- undo ------------------------------------------------------------------------
    def _save(self, cast: Node, touched: Sequence[int]) -> tuple:
        u, v = cast.inputs[0], cast.outputs[0]
        users = {id(n): (n, n.inputs) for n in v.users}
        groups = {g: list(self.groups[g]) for g in touched}
        return list(self.graph.nodes), list(u.users), list(v.users), users, groups, (u, v)

    def _restore(self, saved: tuple, copies: list[Node]) -> None:
        nodes, u_users, v_users, users, groups, (u, v) = saved
        self.graph.nodes[:] = nodes
        u.users[:] = u_users
        v.users[:] = v_users
        for node, inputs in users.values():
            node.inputs = inputs
        for g, members in groups.items():
            self.groups[g] = members
        for copy in copies:
            self.names.discard(copy.name)
            self.names.discard(copy.outputs[0].name)

    def _fresh(self, hint: str) -> str:
        name, k = hint, 0
        while name in self.names:
            k += 1
            name = f"{hint}_{k}"
        self.names.add(name)
        return name
