"""Scan a whole model for ops tilefuse cannot convert, before converting anything."""
from __future__ import annotations

from typing import Iterator

import onnx

from tilefuse.errors import UnsupportedOp, UnsupportedOpError
from tilefuse.frontend import registry
from tilefuse.frontend.context import ONNX_DTYPES


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


def find_unsupported(model: onnx.ModelProto, *, any_opset: bool = False) -> list[UnsupportedOp]:
    """Every (domain, op, opset) without a converter, with the nodes that use it.

    With ``any_opset``, an op counts as supported if some opset of it is (the check
    made before a model is upgraded to the opsets the converters cover).
    """
    registry._load_converters()
    opsets = opsets_of(model)
    missing: dict[tuple[str, str, int, str], list[str]] = {}
    typed = _declared_types(model.graph)
    for node, label in _walk(model.graph):
        domain = "" if node.domain == "ai.onnx" else node.domain
        opset = opsets.get(domain, 0)
        found = registry.known(domain, node.op_type) if any_opset else registry.lookup(domain, node.op_type, opset)
        reason = "" if found else "no converter"
        if found:
            bad = _unsupported_dtypes(node, typed)
            reason = f"element type {', '.join(bad)}" if bad else ""
        if reason:
            missing.setdefault((domain, node.op_type, opset, reason), []).append(label)
    return [UnsupportedOp(d, op, v, tuple(nodes), why) for (d, op, v, why), nodes in sorted(missing.items())]


NOT_A_TENSOR = -1  # a sequence, map or optional value


def _declared_types(graph: onnx.GraphProto) -> dict[str, int]:
    """Element types the model declares: inputs, outputs, value_info, initializers."""
    types = {
        vi.name: vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else NOT_A_TENSOR
        for vi in (*graph.input, *graph.output, *graph.value_info)
    }
    types.update({t.name: t.data_type for t in graph.initializer})
    return types


def _unsupported_dtypes(node: onnx.NodeProto, typed: dict[str, int]) -> list[str]:
    """Element types tilefuse has no dtype for, among those this node touches."""
    codes = [typed[n] for n in (*node.input, *node.output) if n in typed and typed[n]]
    for attr in node.attribute:
        if attr.name == "to" and attr.type == onnx.AttributeProto.INT:
            codes.append(attr.i)
        if attr.type == onnx.AttributeProto.TENSOR:
            codes.append(attr.t.data_type)
    return sorted({_type_name(c) for c in codes if c not in ONNX_DTYPES})


def _type_name(code: int) -> str:
    if code == NOT_A_TENSOR:
        return "non-tensor (sequence/map/optional)"
    if code not in onnx.TensorProto.DataType.values():
        return f"{code} (no ONNX type has this number)"
    return onnx.TensorProto.DataType.Name(code)


def check_supported(model: onnx.ModelProto, *, any_opset: bool = False) -> None:
    unsupported = find_unsupported(model, any_opset=any_opset)
    if unsupported:
        raise UnsupportedOpError(unsupported)
