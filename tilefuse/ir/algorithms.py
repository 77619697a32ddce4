"""Graph algorithms on a networkx view of the IR: order, reachability, convexity."""
from __future__ import annotations

from typing import Iterable

import networkx as nx

from tilefuse.ir.graph import Graph, Node


def to_networkx(graph: Graph) -> nx.DiGraph:
    """A DiGraph whose vertices are the graph's nodes, with an edge per def-use link."""
    g = nx.DiGraph()
    g.add_nodes_from(graph.nodes)
    for node in graph.nodes:
        for v in node.inputs:
            if v.producer is not None:
                g.add_edge(v.producer, node)
    return g


def topological_order(graph: Graph) -> list[Node]:
    """Nodes in a deterministic topological order (ties broken by current position)."""
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    return list(nx.lexicographical_topological_sort(to_networkx(graph), key=lambda n: position[id(n)]))


def reachable(graph: Graph, start: Node) -> set[Node]:
    """Every node that depends on ``start`` (not including it)."""
    return set(nx.descendants(to_networkx(graph), start))


def is_convex(graph: Graph, group: Iterable[Node]) -> bool:
    """True if no path leaves ``group`` and comes back into it."""
    g = to_networkx(graph)
    members = set(group)
    outside_successors = {s for n in members for s in g.successors(n) if s not in members}
    for s in outside_successors:
        if members & (nx.descendants(g, s) | {s}):
            return False
    return True
