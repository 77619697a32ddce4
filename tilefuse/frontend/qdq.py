"""Quantized (QDQ) products as integer products, where the target has them.

A QDQ model (onnxruntime's ``quantize_static``, most quantization toolkits) keeps its
MatMuls in float and says what may be integer with DequantizeLinear nodes in front of
them: ``MatMul(DQ(x_q, s_x, z_x), DQ(W_q, s_w))``. Run as written, each product reads
dequantized floats, which is exact but as slow as the float model, or slower. Where
``GemmPolicy.integer_products`` says the target has integer products, ``integer_products``
rewrites each such MatMul as the identity it stands for::

    MatMul(DQ(x_q), DQ(W_q)) = Cast<float>(MatMulInteger(x_q, W_q, z_x)) * (s_x * s_w)

when ``x``'s scale and zero point are one constant each (per tensor), ``W`` is a constant
2-D 8-bit matrix with a zero-free zero point, and ``W``'s scale is one value or one per
column (DequantizeLinear's axis 1). The integer product sums exactly in int32, so the
result is the dequantized product's, rounded once instead of once a term. Other
MatMuls (a per-row or blocked scale, a zero point on the weight, a float16 scale) are left
as they are and stay correct in float. The DequantizeLinear nodes stay for their other
readers, if any; the importer drops the dead ones.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tilefuse.compare import PRECISION_TOLERANCE

_EIGHT_BIT = (onnx.TensorProto.UINT8, onnx.TensorProto.INT8)


def integer_products(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its quantized MatMuls rewritten as above (a copy; ``model`` itself
    if none qualifies)."""
    g = model.graph
    consts = _constants(g)
    taken = {*consts, *(t.name for t in g.initializer), *(x for n in g.node for x in (*n.input, *n.output))}
    producers = {out: n for n in g.node for out in n.output}
    rewrites: dict[int, list[onnx.NodeProto]] = {}
    extra: list[onnx.TensorProto] = []
    for i, node in enumerate(g.node):
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
            continue
        dq_x, dq_w = (producers.get(name) for name in node.input)
        found = _operands(dq_x, dq_w, consts)
        if found is None:
            continue
        x_q, z_x, scale = found
        tag = f"{node.name or node.output[0]}/integer"
        scale_name, acc, wide = (_fresh(f"{tag}/{what}", taken) for what in ("scale", "int32", "float"))
        extra.append(numpy_helper.from_array(scale, scale_name))
        inputs = [x_q, dq_w.input[0]] + ([z_x] if z_x else [])  # type: ignore[union-attr]
        rewrites[i] = [
            helper.make_node("MatMulInteger", inputs, [acc], name=f"{tag}/MatMulInteger"),
            helper.make_node("Cast", [acc], [wide], name=f"{tag}/Cast", to=onnx.TensorProto.FLOAT),
            helper.make_node("Mul", [wide, scale_name], [node.output[0]], name=f"{tag}/Mul"),
        ]
    if not rewrites:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    for i, node in enumerate(g.node):
        out.graph.node.extend(rewrites.get(i, [node]))
    out.graph.initializer.extend(extra)
    return out


def is_quantized(model: onnx.ModelProto) -> bool:
    """Whether ``model``, in its graph or a subgraph, rounds values it computes to 8-bit
    steps (a QuantizeLinear or DynamicQuantizeLinear of anything but a constant) or
    dequantizes values (a DequantizeLinear: quantized weights, which onnxruntime multiplies
    with activations it quantizes on the fly, MatMulNBits). Either way two correct runs
    differ by about a step (``tilefuse.compare``'s "int8" tolerance)."""
    def walk(g: onnx.GraphProto) -> bool:
        consts = {t.name for t in g.initializer} | {o for n in g.node if n.op_type == "Constant" for o in n.output}
        for n in g.node:
            if n.op_type == "DequantizeLinear":
                return True
            if n.op_type in ("QuantizeLinear", "DynamicQuantizeLinear") and n.input and n.input[0] not in consts:
                return True
            if any(walk(sub) for a in n.attribute for sub in (*([a.g] if a.HasField("g") else []), *a.graphs)):
                return True
        return False
    return walk(model.graph)


def checked_precision(model: onnx.ModelProto | str | Path, precision: str = "fp32") -> str:
    """The precision a run of ``model`` computed in ``precision`` is checked at: "int8"
    where the model is quantized and that is the looser."""
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model), load_external_data=False)
    if is_quantized(proto) and PRECISION_TOLERANCE["int8"] > PRECISION_TOLERANCE.get(precision, 0.0):
        return "int8"
    return precision


def _operands(dq_x: onnx.NodeProto | None, dq_w: onnx.NodeProto | None,
              consts: dict[str, np.ndarray]) -> tuple[str, str, np.ndarray] | None:
    """(x's quantized tensor, its zero point's name or "", the product's float32 scale)
    where ``dq_x`` and ``dq_w`` make a MatMul an integer product; else None."""
    if not (_is_dq(dq_x) and _is_dq(dq_w)):
        return None
    assert dq_x is not None and dq_w is not None
    w = consts.get(dq_w.input[0])
    s_x, z_x = _param(dq_x, 1, consts), _param(dq_x, 2, consts)
    s_w, z_w = _param(dq_w, 1, consts), _param(dq_w, 2, consts)
    if w is None or w.ndim != 2 or w.dtype not in (np.int8, np.uint8) or s_x is None or s_w is None:
        return None
    if s_x.dtype != np.float32 or s_w.dtype != np.float32 or s_x.size != 1:
        return None
    if z_x is not None and z_x.size != 1:
        return None
    if z_w is not None and np.any(z_w):
        return None
    n = w.shape[1]
    if s_w.size == 1:
        column_scale = s_w.reshape(())
    elif s_w.shape == (n,) and _attr(dq_w, "axis", 1) in (1, -1):
        column_scale = s_w
    else:
        return None
    scale = (np.float32(s_x.reshape(())) * column_scale).astype(np.float32)
    return dq_x.input[0], dq_x.input[2] if z_x is not None else "", scale


def _is_dq(node: onnx.NodeProto | None) -> bool:
    """A plain per-tensor or per-axis DequantizeLinear to float32."""
    return (node is not None and node.op_type == "DequantizeLinear" and node.domain in ("", "ai.onnx")
            and not _attr(node, "block_size", 0) and _attr(node, "output_dtype", 0) in (0, onnx.TensorProto.FLOAT))


def _param(node: onnx.NodeProto, i: int, consts: dict[str, np.ndarray]) -> np.ndarray | None:
    name = node.input[i] if len(node.input) > i else ""
    return consts.get(name) if name else None


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    for a in node.attribute:
        if a.name == name:
            return int(helper.get_attribute_value(a))
    return default


def _constants(g: onnx.GraphProto) -> dict[str, np.ndarray]:
    """Initializers and ``Constant`` nodes' tensors by name (external or corrupt ones,
    which the importer reports, are left out)."""
    out: dict[str, np.ndarray] = {}
    for t in _tensors(g):
        try:
            out[t.name] = numpy_helper.to_array(t)
        except Exception:  # the importer reads every initializer again and names what is wrong
            continue
    return out


def _tensors(g: onnx.GraphProto) -> Iterable[onnx.TensorProto]:
    for t in g.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL and t.data_type in (*_EIGHT_BIT, onnx.TensorProto.FLOAT):
            yield t
    for n in g.node:
        if n.op_type == "Constant" and len(n.output) == 1:
            for a in n.attribute:
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    t = onnx.TensorProto()
                    t.CopyFrom(a.t)
                    t.name = n.output[0]
                    if t.data_location != onnx.TensorProto.EXTERNAL and t.data_type in (*_EIGHT_BIT, onnx.TensorProto.FLOAT):
                        yield t


def _fresh(name: str, taken: set[str]) -> str:
    """``name``, or ``name`` and a number, that no value of the graph has; now taken."""
    out, i = name, 0
    while out in taken:
        i += 1
        out = f"{name}{i}"
    taken.add(out)
    return out
