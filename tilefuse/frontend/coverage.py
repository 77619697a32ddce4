"""Scan a whole model for ops tilefuse cannot convert, before converting anything."""
from __future__ import annotations

from typing import Iterator

import onnx

from tilefuse.errors import UnsupportedOp, UnsupportedOpError
from tilefuse.frontend import registry


def _walk(graph: onnx.GraphProto, prefix: str = "") -> Iterator[tuple[onnx.NodeProto, str]]:
    for i, node in enumerate(graph.node):
        label = prefix + (node.name or f"{node.op_type}#{i}")
        yield node, label
        for attr in node.attribute:
            subgraphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subgraphs:
                yield from _walk(sub, prefix=f"{label}/{attr.name}/")


def opsets_of(model: onnx.ModelProto) -> dict[str, int]:
    return {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}


def find_unsupported(model: onnx.ModelProto) -> list[UnsupportedOp]:
    """Every (domain, op, opset) without a converter, with the nodes that use it."""
    registry._load_converters()
    opsets = opsets_of(model)
    missing: dict[tuple[str, str, int], list[str]] = {}
    for node, label in _walk(model.graph):
        domain = "" if node.domain == "ai.onnx" else node.domain
        opset = opsets.get(domain, 0)
        if registry.lookup(domain, node.op_type, opset) is None:
            missing.setdefault((domain, node.op_type, opset), []).append(label)
    return [UnsupportedOp(d, op, v, tuple(nodes)) for (d, op, v), nodes in sorted(missing.items())]


def check_supported(model: onnx.ModelProto) -> None:
    unsupported = find_unsupported(model)
    if unsupported:
        raise UnsupportedOpError(unsupported)
