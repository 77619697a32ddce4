"""What the graph rewrites before grouping share: fresh names, and nodes made in place of
others (``split_reductions.py``, ``split_chains.py``)."""
from __future__ import annotations

from typing import Sequence

from tilefuse.ir.graph import Graph, Node, Value
from tilefuse.ir.prims import Primitive


class FreshNames:
    """Names not yet taken by the graph's values and nodes."""

    def __init__(self, graph: Graph) -> None:
        self.taken = {v.name for v in graph.values()} | {n.name for n in graph.nodes}

    def fresh(self, base: str) -> str:
        name, i = base, 1
        while name in self.taken:
            name, i = f"{base}.{i}", i + 1
        self.taken.add(name)
        return name


class Emitter:
    """Nodes made to replace others, in order (``made``): each named after the node it
    stands for (``node`` unless a call names another) and keeping that node's ``origin``,
    so the report and ``--explain`` still name the ONNX node."""

    def __init__(self, node: Node, names: FreshNames) -> None:
        self.node, self.names = node, names
        self.made: list[Node] = []

    def __call__(self, prim: Primitive, inputs: Value | Sequence[Value], hint: str, result: Value | None = None, *,
                 origin: Node | None = None) -> Value:
        """The value ``prim`` makes of ``inputs`` (``result`` where given: an existing value,
        of the same type, that the new node writes)."""
        inputs = (inputs,) if isinstance(inputs, Value) else tuple(inputs)
        origin = origin or self.node
        (t,) = prim.infer([v.type for v in inputs])
        n = Node(prim, inputs, (), self.names.fresh(f"{origin.name}/{hint}"), origin.origin)
        if result is None:
            result = Value(self.names.fresh(f"{origin.name}/{hint}"), t, producer=n)
        else:
            assert result.type == t, (result.type, t)
            result.producer = n
        n.outputs = (result,)
        for v in inputs:
            v.users.append(n)
        self.made.append(n)
        return result
