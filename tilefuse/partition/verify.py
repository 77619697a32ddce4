"""The partition verifier: always on in tests, and run by the pipeline after partitioning."""
from __future__ import annotations

from tilefuse.errors import GraphError
from tilefuse.partition.model import Partition


def verify_partition(partition: Partition) -> None:
    """Raise GraphError unless every node is in exactly one group, every group is convex,
    groups are in topological order (a group reads only earlier groups' values), and a
    group's declared inputs and outputs are exactly what crosses its boundary."""
    graph = partition.graph
    owner: dict[int, int] = {}
    for g in partition.groups:
        if not g.nodes:
            raise GraphError(f"group {g.id} is empty")
        for n in g.nodes:
            if id(n) in owner:
                raise GraphError(f"node {n.name} is in groups {owner[id(n)]} and {g.id}")
            owner[id(n)] = g.id
    missing = [n.name for n in graph.nodes if id(n) not in owner]
    if missing:
        raise GraphError(f"nodes in no group: {missing[:5]}")
    position = {g.id: i for i, g in enumerate(partition.groups)}
    graph_outputs = {id(v) for v in graph.outputs.values()}
    for g in partition.groups:
        members = {id(n) for n in g.nodes}
        reads = {}
        for n in g.nodes:
            for v in n.inputs:
                if v.producer is None or id(v.producer) not in members:
                    reads[id(v)] = v
                if v.producer is not None and id(v.producer) not in members:
                    if position[owner[id(v.producer)]] >= position[g.id]:
                        raise GraphError(f"group {g.id} reads {v.name} from a later group (order or cycle)")
        writes = {
            id(v): v
            for n in g.nodes
            for v in n.outputs
            if id(v) in graph_outputs or any(id(u) not in members for u in v.users)
        }
        if set(reads) != {id(v) for v in g.inputs} or set(writes) != {id(v) for v in g.outputs}:
            raise GraphError(f"group {g.id}: declared inputs/outputs do not match its boundary")
    # Convexity follows from the order check above when every group is contiguous in a
    # topological order of groups: a path leaving group G and re-entering it would need a
    # group both after and before G.
