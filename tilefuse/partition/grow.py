"""Growing fusion groups: anchors first, then epilogues, prologues and leftovers.

The analysis (kinds, rules, costs) is elsewhere; this module decides which neighbouring
groups merge, in a fixed, deterministic order:

1. attention chains (contraction, row-wise ops, contraction) as whole regions;
2. sibling contractions on one activation (Q, K, V projections) into one wide GEMM;
3. epilogues: consumers of contraction groups (bias, activation, residual, row norm);
4. leftovers: elementwise, index and reduction neighbours with each other;
5. prologues: elementwise groups whose only consumer is a contraction group (casts,
   scaling, transposes of an operand);
6. a final sweep over all neighbours, so that every pair left apart has a reason.

Every merge must keep the group convex, pass the structural rules (the depth cap among them), fit the size cap,
and not cost more than the two kernels apart (recomputation counted).
"""
from __future__ import annotations

import math
from typing import Iterable

from tilefuse.ir.graph import Graph, Node
from tilefuse.partition.cost import Cost, kernel_cost
from tilefuse.partition.kinds import FusionKind, fusion_kind
from tilefuse.partition.rules import structure_problem
from tilefuse.patterns import StagedMatch, match_group
from tilefuse.patterns.gemm import siblings
from tilefuse.target import Target


class _Group:
    __slots__ = ("id", "nodes", "lo", "hi", "kind")

    def __init__(self, id: int, node: Node, pos: int) -> None:
        self.id = id
        self.nodes = [node]
        self.lo = self.hi = pos
        self.kind = fusion_kind(node)


class Grower:
    def __init__(self, graph: Graph, target: Target) -> None:
        self.graph = graph
        self.target = target
        self.pos = {id(n): i for i, n in enumerate(graph.nodes)}
        self.owner: dict[int, _Group] = {}
        for i, n in enumerate(graph.nodes):
            self.owner[id(n)] = _Group(i, n, i)
        self.graph_outputs = frozenset(id(v) for v in graph.outputs.values())
        self._staged: dict[tuple[int, ...], tuple[tuple[Node, ...], bool]] = {}

    # -- the group DAG ---------------------------------------------------------------
    def groups(self) -> list[_Group]:
        seen: dict[int, _Group] = {}
        for n in self.graph.nodes:
            g = self.owner[id(n)]
            seen.setdefault(g.id, g)
        return list(seen.values())

    def consumers(self, g: _Group) -> list[_Group]:
        out: dict[int, _Group] = {}
        for n in g.nodes:
            for v in n.outputs:
                for u in v.users:
                    h = self.owner[id(u)]
                    if h is not g:
                        out.setdefault(h.id, h)
        return sorted(out.values(), key=lambda h: h.lo)

    def producers(self, g: _Group) -> list[_Group]:
        out: dict[int, _Group] = {}
        for n in g.nodes:
            for v in n.inputs:
                if v.producer is not None:
                    h = self.owner[id(v.producer)]
                    if h is not g:
                        out.setdefault(h.id, h)
        return sorted(out.values(), key=lambda h: -h.hi)

    def _path_via_other(self, src: _Group, dst: _Group) -> bool:
        """Is there a path src -> X -> ... -> dst through some group X != dst?"""
        stack = [h for h in self.consumers(src) if h is not dst and h.lo <= dst.hi]
        seen = {h.id for h in stack}
        while stack:
            h = stack.pop()
            for k in self.consumers(h):
                if k is dst:
                    return True
                if k.id not in seen and k.lo <= dst.hi:
                    seen.add(k.id)
                    stack.append(k)
        return False

    # -- costs ------------------------------------------------------------------------
    def outputs_of(self, nodes: Iterable[Node]) -> list:
        members = {id(n) for n in nodes}
        return [
            v
            for n in nodes
            for v in n.outputs
            if id(v) in self.graph_outputs or any(id(u) not in members for u in v.users)
        ]

    def cost(self, nodes: list[Node]) -> Cost:
        base = kernel_cost(nodes, self.outputs_of(nodes))
        base = base + self._narrow_tile_cost(nodes, base)
        return (base + Cost(flops=self._recompute_flops(nodes)) + self._idle_core_cost(nodes, base)
                + self._serial_cost(nodes, base))

    def staged(self, nodes: list[Node]) -> bool:
        """Whether ``nodes`` (in graph order; cast copies the cast pass makes included) as
        one kernel has only the staged schedule (its pattern, asked of ``tilefuse/patterns``
        as the final group's is; remembered per member set)."""
        key = tuple(sorted(map(id, nodes)))
        if key not in self._staged:  # the nodes are kept with the answer, so no id is reused
            match = match_group(nodes, self.outputs_of(nodes), self.target)  # (callers keep graph order)
            self._staged[key] = (tuple(nodes), isinstance(match, StagedMatch))
        return self._staged[key][1]

    def staged_share(self, nodes: list[Node]) -> float:
        """The share of the machine a staged kernel of ``nodes`` runs on: one block of
        ``StagedPolicy.threads`` on a GPU (of its cores' lanes). On a CPU all of it for
        its nests (they run on the thread pool) but one core where it holds a product:
        the staged schedule walks a product's tiles one after another, each a small
        product on the calling thread (tile_ir/lower/staged.py; YOLOv8's convolutions
        merged with their block's Concat were 23 of its 56 kernels, none faster on two
        threads than on one)."""
        d = self.target.device
        if not d.max_block_threads:
            products = any(fusion_kind(n) is FusionKind.CONTRACTION for n in nodes)
            return 1.0 / d.cores if products else 1.0
        return min(1.0, self.target.staged.threads / d.lanes_per_core) / d.cores

    def _serial_cost(self, nodes: list[Node], base: Cost) -> Cost:
        """A kernel that only the staged schedule can run uses ``staged_share`` of the
        machine: counted as that much more work and traffic, and on a GPU its few threads
        wait for their loads one after another (``Device.load_latency`` per element read
        or written, shared by its threads). So a merge that leaves only that schedule is
        refused where the kernels apart run in parallel."""
        share = self.staged_share(nodes)
        if share >= 1.0 or not self.staged(nodes):
            return Cost()
        f = 1.0 / share - 1.0
        d = self.target.device
        elements = sum(v.type.size for n in nodes for v in (*n.inputs, *n.outputs))
        serial = elements / self.target.staged.threads * d.load_latency
        return Cost(int(base.flops * f), int(base.matrix_flops * f), int(base.bytes_in * f), int(base.bytes_out * f),
                    serial_seconds=serial, int8_flops=int(base.int8_flops * f))

    def _narrow_tile_cost(self, nodes: list[Node], base: Cost) -> Cost:
        """A kernel that needs whole rows on its tile gets ``row_tile`` rows per tile;
        where the target's matrix unit takes more rows at once (``mma_rows``), its
        products run at that fraction of the matrix rate: counted as that much more work."""
        t = self.target
        if t.device.mma_rows <= t.gemm.row_tile or not base.matrix_flops or not _whole_rows(nodes):
            return Cost()
        extra = base.matrix_flops * (t.device.mma_rows // t.gemm.row_tile - 1)
        return Cost(flops=extra, matrix_flops=extra)

    def _idle_core_cost(self, nodes: list[Node], base: Cost) -> Cost:
        """Whole-row tiles of ``row_tile`` rows may be fewer than the target's cores where
        the products apart (tiles down to ``min_tile``) would fill them: a batch-1 layer
        on a GPU makes 8 whole-row tiles for 132 SMs. The kernel then runs on that share of
        the machine: counted as that much more work."""
        t = self.target
        if not _whole_rows(nodes):
            return Cost()
        shape = [n for n in nodes if fusion_kind(n) is FusionKind.CONTRACTION][-1].outputs[0].type.shape
        rows, cols = math.prod(shape[:-1]), shape[-1]
        whole = min(t.device.cores, -(-rows // t.gemm.row_tile))
        apart = min(t.device.cores, -(-rows // t.gemm.min_tile) * -(-cols // t.gemm.min_tile))
        if whole >= apart:
            return Cost()
        f = apart / whole - 1
        return Cost(flops=int(base.flops * f), matrix_flops=int(base.matrix_flops * f), int8_flops=int(base.int8_flops * f))

    def _recompute_flops(self, nodes: list[Node]) -> int:
        """Elementwise work feeding a contraction operand is redone once per tile of the
        other operand: an A-side prologue N/tile times (once where tiles hold whole rows),
        a B-side one M/tile times."""
        members = {id(n) for n in nodes}
        whole_rows = _whole_rows(nodes)
        extra = 0
        for c in nodes:
            if fusion_kind(c) is not FusionKind.CONTRACTION:
                continue
            out = c.outputs[0].type.shape
            for side, operand in enumerate(c.inputs):
                p = operand.producer
                if p is None or id(p) not in members:
                    continue
                other = out[-1] if side == 0 else out[-2] if len(out) >= 2 else 1
                tiles = 1 if side == 0 and whole_rows else max(1, -(-other // 128))
                extra += (tiles - 1) * sum(
                    n.op.flops([v.type for v in n.inputs], [v.type for v in n.outputs]) for n in _prologue(p, members)
                )
        return extra

    # -- merging ---------------------------------------------------------------------
    def why_not(self, a: _Group, b: _Group) -> str | None:
        if a is b:
            return None
        if FusionKind.OPAQUE in (a.kind, b.kind):
            return "opaque op runs alone"
        if len(a.nodes) + len(b.nodes) > self.target.partition.max_group_nodes:
            return f"group size cap ({self.target.partition.max_group_nodes} primitives)"
        if self._path_via_other(a, b) or self._path_via_other(b, a):
            return "would create a cycle"
        merged = sorted(a.nodes + b.nodes, key=lambda n: self.pos[id(n)])
        problem = structure_problem(merged, self.target, self.graph_outputs)
        if problem:
            return problem
        t = self.target
        if self.cost(merged).seconds(t) > self.cost(a.nodes).seconds(t) + self.cost(b.nodes).seconds(t):
            if self.staged(merged) and not (self.staged(a.nodes) and self.staged(b.nodes)):
                threads = t.staged.threads
                where = (f"one block of {threads} thread{'s' if threads > 1 else ''} on {t.name}" if t.device.max_block_threads
                         else f"its products one tile at a time on one of {t.device.cores} cores")
                return f"only the staged schedule runs the merged group ({where}): slower than the kernels apart"
            return "no modelled gain (recomputation or narrow tiles outweigh the saved traffic)"
        return None

    def merge(self, a: _Group, b: _Group) -> _Group:
        if len(a.nodes) < len(b.nodes):
            a, b = b, a
        a.nodes = sorted(a.nodes + b.nodes, key=lambda n: self.pos[id(n)])
        a.lo, a.hi = min(a.lo, b.lo), max(a.hi, b.hi)
        a.kind = max(a.kind, b.kind)
        a.id = min(a.id, b.id)
        for n in b.nodes:
            self.owner[id(n)] = a
        return a

    def try_merge(self, a: _Group, b: _Group) -> _Group | None:
        return None if self.why_not(a, b) else self.merge(a, b)

    def convex(self, nodes: list[Node]) -> bool:
        """No path leaves ``nodes`` and comes back (walked on the node graph; a node
        after the last member in graph order cannot lead back)."""
        members = {id(n) for n in nodes}
        frontier = [u for n in nodes for v in n.outputs for u in v.users if id(u) not in members]
        limit = max(self.pos[id(n)] for n in nodes)
        seen: set[int] = set()
        while frontier:
            u = frontier.pop()
            if id(u) in seen or self.pos[id(u)] > limit:
                continue
            seen.add(id(u))
            for v in u.outputs:
                for w in v.users:
                    if id(w) in members:
                        return False
                    frontier.append(w)
        return True

    def try_merge_region(self, nodes: list[Node]) -> bool:
        """Merge the groups of ``nodes`` at once if the result is legal."""
        groups = list({id(self.owner[id(n)]): self.owner[id(n)] for n in nodes}.values())
        members = [n for g in groups for n in g.nodes]
        if len(members) > self.target.partition.max_group_nodes or structure_problem(
            sorted(members, key=lambda n: self.pos[id(n)]), self.target, self.graph_outputs
        ):
            return False
        if not self.convex(members):
            return False
        ordered = sorted(members, key=lambda n: self.pos[id(n)])
        if self.staged_share(ordered) < 1.0 and self.staged(ordered):  # e.g. a softmax no attention lowering takes
            return False
        g = groups[0]
        for h in groups[1:]:
            g = self.merge(g, h)
        return True


def _whole_rows(nodes: list[Node]) -> bool:
    """Weight products whose kernel needs whole output rows on a tile: a row reduction
    after them (a norm), or two of them chained (an MLP)."""
    kinds = [fusion_kind(n) for n in nodes]
    products = [n for n, k in zip(nodes, kinds) if k is FusionKind.CONTRACTION]
    if not products or not all(p.inputs[1].is_constant for p in products):
        return False
    chain = len(products) == 2 and not siblings(products)
    return chain or any(k is FusionKind.REDUCE for k in kinds)


def _prologue(start: Node, members: set[int]) -> list[Node]:
    """The elementwise/index producers of a contraction operand inside a group."""
    out, stack, seen = [], [start], set()
    while stack:
        n = stack.pop()
        if id(n) in seen or fusion_kind(n) > FusionKind.ELEMENTWISE:
            continue
        seen.add(id(n))
        out.append(n)
        stack += [v.producer for v in n.inputs if v.producer is not None and id(v.producer) in members]
    return out


def grow(graph: Graph, target: Target) -> Grower:
    """Run the phases; the Grower holds the final groups."""
    g = Grower(graph, target)
    _attention_regions(g)
    _sibling_contractions(g)
    _epilogues(g)
    _leftovers(g)
    _prologues(g)
    _final_sweep(g)
    return g


def _attention_regions(g: Grower) -> None:
    """For each product whose left operand comes, through row-wise ops only, from another
    product, merge everything between the two: QK^T, scale, mask, softmax, PV."""
    for c2 in g.graph.nodes:
        if fusion_kind(c2) is not FusionKind.CONTRACTION or c2.inputs[0].producer is None:
            continue
        if c2.inputs[1].is_constant:  # a weight chain, not attention: grown pairwise, costed
            continue
        region, c1 = _between_contraction(c2)
        if c1 is not None:
            g.try_merge_region(region)


def _between_contraction(c2: Node) -> tuple[list[Node], Node | None]:
    """Walk back from c2's left operand through non-contraction ops to one contraction."""
    region: dict[int, Node] = {id(c2): c2}
    stack = [c2.inputs[0].producer]
    found: Node | None = None
    while stack:
        n = stack.pop()
        if n is None or id(n) in region:
            continue
        kind = fusion_kind(n)
        if kind is FusionKind.OPAQUE:
            return [], None
        if kind is FusionKind.CONTRACTION:
            if found is not None and found is not n:
                return [], None
            found = n
            region[id(n)] = n
            continue
        region[id(n)] = n
        for v in n.inputs:
            if v.producer is not None and not v.is_constant:
                # Only follow values on the path from c1: stop at values that do not
                # depend on a contraction (masks, scales) - they stay outside.
                if _depends_on_contraction(v.producer, limit=64):
                    stack.append(v.producer)
    return list(region.values()), found


def _depends_on_contraction(n: Node, limit: int) -> bool:
    stack, seen = [n], 0
    while stack and seen < limit:
        m = stack.pop()
        seen += 1
        kind = fusion_kind(m)
        if kind is FusionKind.CONTRACTION:
            return True
        if kind is FusionKind.OPAQUE:
            continue
        stack += [v.producer for v in m.inputs if v.producer is not None]
    return False


def _sibling_contractions(g: Grower) -> None:
    by_input: dict[tuple[int, tuple[int, ...]], list[Node]] = {}
    for n in g.graph.nodes:
        if fusion_kind(n) is FusionKind.CONTRACTION and n.inputs[1].is_constant:
            by_input.setdefault((id(n.inputs[0]), n.inputs[1].type.shape), []).append(n)
    for group in by_input.values():
        if len(group) > 1 and siblings(group):
            first = g.owner[id(group[0])]
            for other in group[1:]:
                first = g.try_merge(first, g.owner[id(other)]) or first


def _until_stable(step) -> None:
    while step():
        pass


def _expands(grp: _Group) -> bool:
    """Pure data movement that makes its tensor larger (a broadcast, GQA's K/V repeat):
    better as the consumer's prologue, reading the small tensor, than as an epilogue
    writing the large one."""
    return grp.kind is FusionKind.INJECTIVE and all(
        sum(v.type.nbytes for v in n.outputs) > sum(v.type.nbytes for v in n.inputs if not v.is_constant)
        for n in grp.nodes
    )


def _moves_written_data(g: Grower, grp: _Group) -> bool:
    """Pure data movement (a token select, a slice) of a value that is written anyway: as
    the consumer's prologue it is addressing into that value; as an epilogue it would be
    one more output of a different shape for the producer's tiles to write."""
    if grp.kind is not FusionKind.INJECTIVE:
        return False
    members = {id(n) for n in grp.nodes}
    sources = [v for n in grp.nodes for v in n.inputs if v.producer is not None and id(v.producer) not in members]
    return bool(sources) and all(
        id(v) in g.graph_outputs or any(id(u) not in members for u in v.users) for v in sources
    )


def _epilogues(g: Grower) -> None:
    def step() -> bool:
        changed = False
        for grp in g.groups():
            if grp.kind is not FusionKind.CONTRACTION:
                continue
            for c in g.consumers(grp):
                if (c.kind < FusionKind.CONTRACTION and not _expands(c) and not _moves_written_data(g, c)
                        and g.owner[id(c.nodes[0])] is c):
                    if g.try_merge(g.owner[id(grp.nodes[0])], c):
                        changed = True
        return changed

    _until_stable(step)


def _prologues(g: Grower) -> None:
    for grp in g.groups():
        if grp.kind is not FusionKind.CONTRACTION:
            continue
        for p in g.producers(grp):
            if p.kind <= FusionKind.ELEMENTWISE and all(c is grp for c in g.consumers(p)):
                g.try_merge(g.owner[id(grp.nodes[0])], p)


def _leftovers(g: Grower) -> None:
    def step() -> bool:
        changed = False
        for grp in g.groups():
            if grp.kind >= FusionKind.CONTRACTION or g.owner[id(grp.nodes[0])] is not grp:
                continue
            consumers = g.consumers(grp)
            for c in consumers + g.producers(grp):
                if c.kind < FusionKind.CONTRACTION and g.owner[id(c.nodes[0])] is c:
                    moved = c if c in consumers else grp  # the consumer side of the pair
                    if _moves_written_data(g, moved):
                        continue  # left for its consumer's prologue
                    cur = g.owner[id(grp.nodes[0])]
                    if cur is not c and g.try_merge(cur, c):
                        changed = True
        return changed

    _until_stable(step)


def _final_sweep(g: Grower) -> None:
    def step() -> bool:
        for grp in g.groups():
            consumers = g.consumers(grp)
            for c in consumers:
                # A shared producer stays out of a contraction's kernel (as in the prologue
                # phase): inside, it would be one more output the tiled schedule must write.
                if c.kind is FusionKind.CONTRACTION and grp.kind < FusionKind.CONTRACTION and len(consumers) > 1:
                    continue
                if g.try_merge(grp, c):
                    return True
        return False

    _until_stable(step)
