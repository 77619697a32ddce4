"""Partition: classify primitives, grow fusion groups under a cost model, explain.

``partition_graph(graph, target)`` is analysis (kinds, rules, costs), then decision
(grow.py), then the result as ordered FusedGroups, checked by the verifier.
"""
from __future__ import annotations

import heapq

from tilefuse.ir.graph import Graph
from tilefuse.partition.grow import Grower, grow
from tilefuse.partition.kinds import FusionKind, fusion_kind
from tilefuse.partition.model import FusedGroup, Partition, Refusal
from tilefuse.partition.verify import verify_partition
from tilefuse.target import Target

__all__ = ["FusedGroup", "FusionKind", "Partition", "Refusal", "partition_graph", "verify_partition"]


def partition_graph(graph: Graph, target: Target, *, verify: bool = True) -> Partition:
    grower = grow(graph, target)
    ordered = _topological(grower)
    groups: list[FusedGroup] = []
    for i, g in enumerate(ordered):
        nodes = tuple(g.nodes)
        members = {id(n) for n in nodes}
        inputs = {}
        for n in nodes:
            for v in n.inputs:
                if v.producer is None or id(v.producer) not in members:
                    inputs.setdefault(id(v), v)
        outputs = grower.outputs_of(nodes)
        kind = max(fusion_kind(n) for n in nodes)
        groups.append(FusedGroup(i, nodes, kind, tuple(inputs.values()), tuple(outputs), grower.cost(list(nodes))))
    partition = Partition(graph, target, groups, _refusals(grower, ordered))
    if verify:
        verify_partition(partition)
    return partition


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


def _refusals(grower: Grower, ordered: list) -> list[Refusal]:
    """Why each pair of neighbouring groups stayed apart, asked of the final groups."""
    index = {g.id: i for i, g in enumerate(ordered)}
    out = []
    for g in ordered:
        for c in grower.consumers(g):
            reason = grower.why_not(g, c) or "shared producer kept out of a contraction's kernel (read by several kernels)"
            edge = next(
                (n, u) for n in g.nodes for v in n.outputs for u in v.users if grower.owner[id(u)] is c
            )
            out.append(Refusal(index[g.id], index[c.id], edge[0].name, edge[1].name, reason))
    return out
