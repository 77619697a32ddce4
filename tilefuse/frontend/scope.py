"""Converting a list of ONNX nodes in a scope of named values: the model's graph, or a
subgraph (an ``If`` branch) that also reads the values of the graphs around it."""
from __future__ import annotations

from typing import Iterable, Mapping

import onnx

from tilefuse.errors import ConversionError, TilefuseError
from tilefuse.frontend import registry
from tilefuse.frontend.context import NodeContext
from tilefuse.ir.builder import Builder
from tilefuse.ir.graph import Value


class Scope:
    """ONNX value names -> IR values, own names first, then the enclosing scope's.

    An inlined subgraph's scope reads its parent's values as they are. A capturing scope
    (a subgraph converted into a graph of its own, ``b`` its builder) turns a parent's
    value into an input of its graph the first time a node reads it and records the
    pair in ``captured``, in order; a constant comes in as a constant.
    """

    def __init__(self, b: Builder, parent: "Scope | None" = None, *, capture: bool = False) -> None:
        self.b = b
        self.parent = parent
        self.capture = capture
        self.values: dict[str, Value] = {}
        self.captured: list[tuple[Value, Value]] = []  # (the parent's value, the input standing for it)

    def __setitem__(self, name: str, v: Value) -> None:
        self.values[name] = v

    def __contains__(self, name: str) -> bool:
        return name in self.values or (self.parent is not None and name in self.parent)

    def __getitem__(self, name: str) -> Value:
        v = self.values.get(name)
        if v is not None:
            return v
        if self.parent is None:
            raise KeyError(name)
        outer = self.parent[name]
        if not self.capture:
            return outer
        if outer.is_constant:  # shared read-only data, a value of this graph
            v = Value(self.b.unique(outer.name), outer.type, data=outer.data)
        else:
            v = self.b.input(outer.name, outer.type)
            self.captured.append((outer, v))
        self.values[name] = v
        return v


def node_label(node: onnx.NodeProto, index: int, prefix: str = "") -> str:
    """The name a node's primitives carry as their ``origin``: its name, or op_type#index,
    after ``prefix`` (``if_node/then_branch/`` in a subgraph)."""
    return prefix + (node.name or f"{node.op_type}#{index}")


def op_types(graph: onnx.GraphProto, prefix: str = "") -> dict[str, str]:
    """Each node's label (``node_label``) -> its op type, subgraphs included: how a plan
    names the ONNX ops a kernel covers."""
    out: dict[str, str] = {}
    for i, node in enumerate(graph.node):
        label = node_label(node, i, prefix)
        out[label] = node.op_type
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                out.update(op_types(attr.g, f"{label}/{attr.name}/"))
    return out


def convert_nodes(b: Builder, scope: Scope, nodes: Iterable[onnx.NodeProto], opsets: Mapping[str, int],
                  prefix: str = "") -> None:
    """Convert ``nodes`` in order with their registered converters, emitting into ``b``
    and naming their outputs in ``scope``. Node labels (for errors and origins) are the
    node's name, or op_type#index, after ``prefix`` (``if_node/then_branch/``)."""
    for i, node in enumerate(nodes):
        label = node_label(node, i, prefix)
        domain = "" if node.domain == "ai.onnx" else node.domain
        entry = registry.lookup(domain, node.op_type, opsets.get(domain, 0))
        assert entry is not None, "coverage was checked before conversion"
        try:
            inputs = [scope[name] if name else None for name in node.input]
        except KeyError as e:
            raise ConversionError(f"{node.op_type} node {label!r} reads {e.args[0]!r}, which nothing defines") from None
        b.origin = label
        ctx = NodeContext(b, node, inputs, opsets.get(domain, 0), label, scope=scope, opsets=opsets)
        try:
            result = entry.fn(ctx)
        except TilefuseError:
            raise
        except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError) as e:
            raise ConversionError(f"{node.op_type} node {label!r}: {e}") from e
        outputs: list[Value | None] = [result] if isinstance(result, Value) else list(result)
        if len(outputs) < len([o for o in node.output if o]):
            raise ConversionError(f"{node.op_type} node {label!r}: produced {len(outputs)} outputs, needs {len(node.output)}")
        for name, v in zip(node.output, outputs):
            if name and v is not None:
                _adopt_name(b, v, name, label)
                scope[name] = v


def _adopt_name(b: Builder, v: Value, name: str, label: str) -> None:
    """Give a value made by this node its ONNX name, for readable graphs and errors."""
    if v.producer is not None and v.producer.origin == label and "/" in v.name:
        v.name = b.unique(name)
    elif v.is_constant and v.name.startswith(("const", "/")):
        v.name = b.unique(name)
