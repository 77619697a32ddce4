"""Convert a float32 ONNX model to float16, graph-level, without torch.

Used for models that are not exported from torch (the hand-built edge graphs) and for
any model whose torch fp16 export is unavailable. The rule is simple and total: every
FLOAT tensor the graph declares or creates becomes FLOAT16; nothing else changes. That
means graph inputs, outputs and value_info, initializers, ``Constant`` values,
``ConstantOfShape`` fill values, ``Cast``/``CastLike`` targets and the ``dtype``
attributes of generator ops, in subgraphs too. Integer and bool tensors are untouched.

Float values beyond float16's range are clipped to +-65504 (masks built from
float32's lowest value would otherwise become -inf and can turn a softmax into NaN);
infinities stay infinities.

A few inputs are float32 whatever the data type (Resize's ``scales``): initializers
feeding only such inputs stay float32, and any other value reaching one goes through a
``Cast`` back to float32.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

FP16_MAX = float(np.finfo(np.float16).max)

# Ops whose ``dtype``/``to`` attribute names an output element type.
_DTYPE_ATTRS = {"Cast": "to", "EyeLike": "dtype", "RandomNormal": "dtype",
                "RandomUniform": "dtype", "RandomNormalLike": "dtype",
                "RandomUniformLike": "dtype", "Multinomial": "dtype", "Bernoulli": "dtype"}

# (op, input index) typed tensor(float) in every opset, not the op's T.
_FLOAT32_INPUTS = {("Resize", 2), ("Upsample", 1)}


def to_float16(model: onnx.ModelProto) -> onnx.ModelProto:
    """A float16 copy of ``model`` (the argument is not modified)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    _convert_graph(out.graph)
    for fn in out.functions:
        for node in fn.node:
            _convert_node(node)
    return out


def tensor_to_float16(tensor: TensorProto) -> TensorProto:
    """``tensor`` with FLOAT data as FLOAT16 (clipped to range), others unchanged."""
    if tensor.data_type != TensorProto.FLOAT:
        return tensor
    if tensor.data_location == TensorProto.EXTERNAL:
        raise ValueError(f"{tensor.name}: load external data before converting to float16")
    array = numpy_helper.to_array(tensor)
    finite = np.isfinite(array)
    array = np.where(finite, np.clip(array, -FP16_MAX, FP16_MAX), array).astype(np.float16)
    return numpy_helper.from_array(array, tensor.name)


def _convert_value_info(vi: onnx.ValueInfoProto) -> None:
    t = vi.type
    # sequence/optional types wrap a tensor type; handle the tensor case and one level of wrap
    for tensor_type in (t.tensor_type, t.sequence_type.elem_type.tensor_type,
                        t.optional_type.elem_type.tensor_type):
        if tensor_type.elem_type == TensorProto.FLOAT:
            tensor_type.elem_type = TensorProto.FLOAT16


def _convert_graph(graph: onnx.GraphProto) -> None:
    pinned, others = set(), set()  # value names read by float32-only inputs / by the rest
    for node in graph.node:
        for j, name in enumerate(node.input):
            (pinned if (node.op_type, j) in _FLOAT32_INPUTS else others).add(name)
    keep_fp32 = {init.name for init in graph.initializer} & (pinned - others)

    for vi in [*graph.input, *graph.output, *graph.value_info]:
        _convert_value_info(vi)
    for i, init in enumerate(graph.initializer):
        if init.data_type == TensorProto.FLOAT and init.name not in keep_fp32:
            graph.initializer[i].CopyFrom(tensor_to_float16(init))
    for node in graph.node:
        _convert_node(node)
    _cast_back_float32_inputs(graph, keep_fp32)


def _cast_back_float32_inputs(graph: onnx.GraphProto, keep_fp32: set[str]) -> None:
    """Feed float32-only inputs through Cast(to=FLOAT) unless they kept float32."""
    nodes: list[onnx.NodeProto] = []
    for node in graph.node:
        for j, name in enumerate(node.input):
            if (node.op_type, j) in _FLOAT32_INPUTS and name and name not in keep_fp32:
                cast_out = f"{name}_as_float32_for_{node.name or node.op_type}_{j}"
                nodes.append(onnx.helper.make_node("Cast", [name], [cast_out],
                                                   to=TensorProto.FLOAT))
                node.input[j] = cast_out
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)


def _convert_node(node: onnx.NodeProto) -> None:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.TENSOR:
            attr.t.CopyFrom(tensor_to_float16(attr.t))
        elif attr.type == onnx.AttributeProto.GRAPH:
            _convert_graph(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            for g in attr.graphs:
                _convert_graph(g)
    if node.op_type == "Constant":
        _convert_scalar_constant(node)
    name = _DTYPE_ATTRS.get(node.op_type)
    if name is not None and node.domain in ("", "ai.onnx"):
        for attr in node.attribute:
            if attr.name == name and attr.i == TensorProto.FLOAT:
                attr.i = TensorProto.FLOAT16


def _convert_scalar_constant(node: onnx.NodeProto) -> None:
    """``Constant(value_float[s]=...)`` makes a FLOAT tensor; rewrite it as a FLOAT16 ``value``."""
    for i, attr in enumerate(node.attribute):
        if attr.name in ("value_float", "value_floats"):
            data = attr.f if attr.name == "value_float" else list(attr.floats)
            array = np.clip(np.asarray(data, dtype=np.float32), -FP16_MAX, FP16_MAX)
            del node.attribute[i]
            node.attribute.append(onnx.helper.make_attribute(
                "value", numpy_helper.from_array(array.astype(np.float16))))
            return
