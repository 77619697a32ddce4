"""Partition: classify primitives, grow fusion groups under a cost model, explain.

``partition_graph(graph, target)`` is analysis (kinds, rules, costs), then decision
(grow.py), then rewrites of the grown groups (casts.py: widening casts move into the
kernels that read them), then the result as ordered FusedGroups, checked by the verifier,
each carrying its pattern's match (which kernel it becomes, ``tilefuse/patterns/``).
"""
from __future__ import annotations

import heapq

from tilefuse.ir.graph import Graph, Value
from tilefuse.partition.casts import sink_widening_casts
from tilefuse.partition.grow import Grower, grow
from tilefuse.partition.kinds import FusionKind, fusion_kind
from tilefuse.partition.split_chains import split_weight_chains
from tilefuse.partition.split_reductions import split_long_reductions
from tilefuse.partition.model import FusedGroup, Partition, Refusal
from tilefuse.partition.verify import verify_partition
from tilefuse.patterns import match_group
from tilefuse.target import Target

__all__ = ["FusedGroup", "FusionKind", "Partition", "Refusal", "partition_graph", "verify_partition"]


def partition_graph(graph: Graph, target: Target, *, verify: bool = True, move_casts: bool = True) -> Partition:
    """Group ``graph``'s nodes into kernels for ``target``. Reductions to fewer outputs than
    the target has cores are split in two first, in ``graph`` (split_reductions.py), and
    a host's weight chains over few rows along their hidden dim (split_chains.py).
    ``move_casts`` lets widening casts move into the kernels that read them, which adds
    copies of those Cast nodes to ``graph`` (see casts.py)."""
    split_long_reductions(graph, target)
    split_weight_chains(graph, target)
    grower = grow(graph, target)
    ordered = _topological(grower)
    apart = _apart(grower, ordered)  # asked of the grown groups, before any rewrite
    members = [list(g.nodes) for g in ordered]
    recomputed = sink_widening_casts(graph, members, target, grower.cost) if move_casts else []
    groups = [_fused_group(i, nodes, grower, target) for i, nodes in enumerate(members)]
    partition = Partition(graph, target, groups, _refusals(apart, groups), recomputed)
    if verify:
        verify_partition(partition)
    return partition


def _fused_group(index: int, nodes: list, grower: Grower, target: Target) -> FusedGroup:
    members = {id(n) for n in nodes}
    inputs: dict[int, Value] = {}
    for n in nodes:
        for v in n.inputs:
            if v.producer is None or id(v.producer) not in members:
                inputs.setdefault(id(v), v)
    kind = max(fusion_kind(n) for n in nodes)
    outputs = tuple(grower.outputs_of(nodes))
    # the members are final here (casts moved): the match is made once, of these
    return FusedGroup(index, tuple(nodes), kind, tuple(inputs.values()), outputs, grower.cost(nodes),
                      match_group(nodes, outputs, target))


def _topological(grower: Grower) -> list:
    """Groups in a topological order of the group DAG, earliest first node first."""
    groups = grower.groups()
    indegree = {g.id: len(grower.producers(g)) for g in groups}
    ready = [(g.lo, g.id, g) for g in groups if indegree[g.id] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, _, g = heapq.heappop(ready)
        order.append(g)
        for c in grower.consumers(g):
            indegree[c.id] -= 1
            if indegree[c.id] == 0:
                heapq.heappush(ready, (c.lo, c.id, c))
    if len(order) != len(groups):
        from tilefuse.errors import GraphError

        raise GraphError("the fusion groups form a cycle")
    return order


def _apart(grower: Grower, ordered: list) -> list[tuple[int, int, str]]:
    """(producer, consumer, why) for each pair of neighbouring grown groups, by position."""
    index = {g.id: i for i, g in enumerate(ordered)}
    return [
        (index[g.id], index[c.id],
         grower.why_not(g, c) or "shared producer kept out of a contraction's kernel (read by several kernels)")
        for g in ordered
        for c in grower.consumers(g)
    ]


def _refusals(apart: list[tuple[int, int, str]], groups: list[FusedGroup]) -> list[Refusal]:
    """The refusals, each naming one edge between the final groups (a moved cast reads
    its producer's value, not the cast's)."""
    owner = {id(n): g.id for g in groups for n in g.nodes}
    out = []
    for a, b, reason in apart:
        edge = next((n, u) for n in groups[a].nodes for v in n.outputs for u in v.users if owner[id(u)] == b)
        out.append(Refusal(a, b, edge[0].name, edge[1].name, reason))
    return out
