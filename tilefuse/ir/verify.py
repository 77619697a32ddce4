"""The graph verifier: run between passes and at every stage boundary in tests."""
from __future__ import annotations

from tilefuse.errors import GraphError
from tilefuse.ir.graph import Graph


def verify_graph(graph: Graph) -> None:
    """Raise GraphError unless the graph is well formed and well typed.

    Checks: nodes are in topological order and read only graph inputs, constants or
    earlier outputs; every node's output types are what its primitive infers; def-use
    links agree both ways; value names are unique; outputs are defined.
    """
    defined: set[int] = {id(v) for v in graph.inputs}
    names: dict[str, int] = {}
    for v in graph.inputs:
        if v.producer is not None or v.is_constant:
            raise GraphError(f"graph input {v.name} has a producer or data")
        _claim(names, v.name, id(v))
    for node in graph.nodes:
        for v in node.inputs:
            if id(v) not in defined:
                if not v.is_constant:
                    raise GraphError(f"node {node.name} reads {v.name} before it is defined")
                if v.producer is not None:
                    raise GraphError(f"constant {v.name} has a producer")
                defined.add(id(v))
                _claim(names, v.name, id(v))
            if not any(u is node for u in v.users):
                raise GraphError(f"{v.name} does not list its user {node.name}")
        try:
            expected = node.op.infer([v.type for v in node.inputs])
        except (TypeError, ValueError) as e:
            raise GraphError(f"node {node.name} ({node.op}) is ill typed: {e}") from None
        got = tuple(v.type for v in node.outputs)
        if expected != got:
            raise GraphError(f"node {node.name}: outputs typed {got}, primitive infers {expected}")
        for v in node.outputs:
            if v.producer is not node:
                raise GraphError(f"{v.name} does not name {node.name} as its producer")
            _claim(names, v.name, id(v))
            defined.add(id(v))
    for node in graph.nodes:
        for v in node.outputs:
            for user in v.users:
                if not any(i is v for i in user.inputs):
                    raise GraphError(f"{v.name} lists {user.name} as a user, which does not read it")
    for name, v in graph.outputs.items():
        if id(v) not in defined and not v.is_constant:
            raise GraphError(f"graph output {name} is not defined")


def _claim(names: dict[str, int], name: str, owner: int) -> None:
    if names.setdefault(name, owner) != owner:
        raise GraphError(f"value name {name} is used twice")
