"""Small hand-built graphs for the corners exporters rarely hit but importers must get right.

Each ``graph_*`` function returns a float32 ``ModelProto`` built with ``onnx.helper``;
float16 variants go through ``fp16.to_float16``. Weights come from a numpy generator
seeded per graph. The leading dimension is symbolic ("N") where the op allows it, so
the shapes table has something to bind.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .fp16 import to_float16
from .spec import ModelSpec

N = 2  # what the shapes table binds "N" to
F = TensorProto.FLOAT


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
           outputs: list[onnx.ValueInfoProto], initializers: dict[str, np.ndarray],
           opset: int, name: str, extra_opsets: dict[str, int] | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, name, inputs, outputs,
        initializer=[numpy_helper.from_array(v, k) for k, v in initializers.items()])
    opsets = [helper.make_opsetid("", opset)]
    opsets += [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    model = helper.make_model(graph, opset_imports=opsets, producer_name="tilefuse-models")
    return onnx.shape_inference.infer_shapes(model, strict_mode=not extra_opsets)


def _rng(name: str) -> np.random.Generator:
    """A generator seeded from the graph's name (crc32: stable across runs, unlike hash)."""
    return np.random.default_rng(zlib.crc32(name.encode()))


def _vi(name: str, dims: list, elem: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, dims)


# ------------------------------------------------------------------- graphs


def graph_broadcast() -> onnx.ModelProto:
    """An elementwise chain over inputs of ranks 4, 3, 2, 1 and a rank-0 constant,
    broadcasting on both sides (smaller operand first in Sub), two outputs of
    different shapes."""
    nodes = [
        helper.make_node("Add", ["x", "row"], ["t1"]),           # (N,3,4,8) + (4,1)
        helper.make_node("Mul", ["t1", "col"], ["t2"]),          # * (8,)
        helper.make_node("Sub", ["chan", "t2"], ["t3"]),         # (3,1,1) - (N,3,4,8)
        helper.make_node("Div", ["t3", "two"], ["t4"]),          # / scalar
        helper.make_node("Max", ["t4", "row", "neg"], ["t5"]),   # variadic, 3-way broadcast
        helper.make_node("Tanh", ["t5"], ["t6"]),
        helper.make_node("Pow", ["t6", "two"], ["t7"]),
        helper.make_node("Add", ["t7", "x"], ["y"]),
        helper.make_node("Mul", ["row", "col"], ["outer"]),      # (4,1) * (8,) -> (4,8)
    ]
    return _model(
        nodes,
        [_vi("x", ["N", 3, 4, 8]), _vi("row", [4, 1]), _vi("col", [8]), _vi("chan", [3, 1, 1])],
        [_vi("y", ["N", 3, 4, 8]), _vi("outer", [4, 8])],
        {"two": np.array(2.0, np.float32), "neg": np.full((1, 1, 8), -0.5, np.float32)},
        13, "edge_broadcast")


def graph_softmax(opset: int) -> onnx.ModelProto:
    """Softmax on axis 1 and LogSoftmax on axis -2 of a rank-4 tensor.

    At opset 13 the axis is one axis. Below 13 the input is coerced to 2-D at the axis
    (all dims from ``axis`` on are normalised together): same op, different maths.
    """
    nodes = [
        helper.make_node("Softmax", ["x"], ["y"], axis=1),
        helper.make_node("LogSoftmax", ["x"], ["z"], axis=-2),
    ]
    return _model(nodes, [_vi("x", ["N", 5, 7, 3])],
                  [_vi("y", ["N", 5, 7, 3]), _vi("z", ["N", 5, 7, 3])], {},
                  opset, f"edge_softmax{opset}")


def graph_split() -> onnx.ModelProto:
    """Split with uneven explicit sizes given as an input (the opset-13 form), three
    outputs each followed by a different op."""
    nodes = [
        helper.make_node("Split", ["x", "sizes"], ["a", "b", "c"], axis=1),
        helper.make_node("Relu", ["a"], ["ya"]),
        helper.make_node("Neg", ["b"], ["yb"]),
        helper.make_node("Sigmoid", ["c"], ["yc"]),
    ]
    return _model(nodes, [_vi("x", ["N", 10, 4])],
                  [_vi("ya", ["N", 2, 4]), _vi("yb", ["N", 3, 4]), _vi("yc", ["N", 5, 4])],
                  {"sizes": np.array([2, 3, 5], np.int64)}, 13, "edge_split")


def graph_gather_neg() -> onnx.ModelProto:
    """Gather with negative indices: a runtime index vector on axis 0 (values in
    [-5, 5)) and a constant 2-D index matrix with negatives on axis -2."""
    data = _rng("gather").standard_normal((5, 10, 6)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["data", "idx"], ["rows"], axis=0),        # (3,10,6)
        helper.make_node("Gather", ["rows", "cols"], ["y"], axis=-2),         # (3,2,2,6)
    ]
    return _model(nodes, [_vi("idx", [3], TensorProto.INT64)], [_vi("y", [3, 2, 2, 6])],
                  {"data": data, "cols": np.array([[-1, 0], [-3, 2]], np.int64)},
                  13, "edge_gather_neg")


def graph_where_cast_clip() -> onnx.ModelProto:
    """Where on a computed condition, float->int32->float Cast (truncates toward zero),
    int64->float and bool->float Casts, Clip with only ``max`` given. The scale before the
    int Cast is a power of two: the product is exact in float16 too, so no input lands on
    a rounding tie that implementations may break differently before truncation."""
    nodes = [
        helper.make_node("Equal", ["m", "zero_i"], ["is0"]),
        helper.make_node("Clip", ["x", "", "half"], ["clipped"]),             # min omitted
        helper.make_node("Where", ["is0", "x", "clipped"], ["w"]),
        helper.make_node("Mul", ["w", "four"], ["w3"]),
        helper.make_node("Cast", ["w3"], ["wi"], to=TensorProto.INT32),
        helper.make_node("Cast", ["wi"], ["wf"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["m"], ["mf"], to=TensorProto.FLOAT),
        helper.make_node("Greater", ["x", "zero_f"], ["pos"]),
        helper.make_node("Cast", ["pos"], ["posf"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["wf", "mf"], ["s"]),
        helper.make_node("Add", ["s", "posf"], ["y"]),
        helper.make_node("Clip", ["y", "lo", "hi"], ["z"]),
    ]
    return _model(
        nodes, [_vi("x", ["N", 16]), _vi("m", ["N", 16], TensorProto.INT64)],
        [_vi("z", ["N", 16])],
        {"zero_i": np.array(0, np.int64), "zero_f": np.array(0.0, np.float32),
         "half": np.array(0.5, np.float32), "four": np.array(4.0, np.float32),
         "lo": np.array(-1.0, np.float32), "hi": np.array(2.5, np.float32)},
        13, "edge_where_cast_clip")


def graph_conv_same() -> onnx.ModelProto:
    """Grouped Conv with auto_pad SAME_UPPER and stride 2 on odd sizes (asymmetric
    padding), then a depthwise even-kernel Conv with SAME_LOWER."""
    rng = _rng("conv")
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], auto_pad="SAME_UPPER",
                         strides=[2, 2], group=2, kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["y"], auto_pad="SAME_LOWER", group=8,
                         kernel_shape=[4, 4]),
    ]
    return _model(
        nodes, [_vi("x", ["N", 4, 9, 9])], [_vi("y", ["N", 8, 5, 5])],
        {"w1": rng.standard_normal((8, 2, 3, 3)).astype(np.float32) * 0.3,
         "b1": rng.standard_normal(8).astype(np.float32) * 0.1,
         "w2": rng.standard_normal((8, 1, 4, 4)).astype(np.float32) * 0.3},
        13, "edge_conv_same")


def graph_einsum() -> onnx.ModelProto:
    """Attention spelled with Einsum: bhid,bhjd->bhij, scale, Softmax, bhij,bhjd->bhid."""
    nodes = [
        helper.make_node("Einsum", ["q", "k"], ["s"], equation="bhid,bhjd->bhij"),
        helper.make_node("Mul", ["s", "scale"], ["ss"]),
        helper.make_node("Softmax", ["ss"], ["p"], axis=-1),
        helper.make_node("Einsum", ["p", "v"], ["y"], equation="bhij,bhjd->bhid"),
    ]
    return _model(
        nodes, [_vi("q", ["N", 2, 5, 8]), _vi("k", ["N", 2, 6, 8]), _vi("v", ["N", 2, 6, 8])],
        [_vi("y", ["N", 2, 5, 8])], {"scale": np.array(8 ** -0.5, np.float32)},
        13, "edge_einsum")


def graph_resize() -> onnx.ModelProto:
    """Resize nearest by scales (asymmetric/floor, as old Upsample did) and linear to
    explicit, non-integer-ratio sizes (half_pixel).

    The sizes input is computed the way exporters do it, Shape -> Slice -> Concat, so
    the batch dimension stays symbolic.
    """
    nodes = [
        helper.make_node("Resize", ["x", "", "scales"], ["up"], mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "two"], ["nc"]),
        helper.make_node("Concat", ["nc", "hw"], ["sizes"], axis=0),
        helper.make_node("Resize", ["x", "", "", "sizes"], ["lin"], mode="linear",
                         coordinate_transformation_mode="half_pixel"),
    ]
    return _model(
        nodes, [_vi("x", ["N", 3, 4, 5])],
        [_vi("up", ["N", 3, 8, 10]), _vi("lin", ["N", 3, 7, 11])],
        {"scales": np.array([1, 1, 2, 2], np.float32),
         "zero": np.array([0], np.int64), "two": np.array([2], np.int64),
         "hw": np.array([7, 11], np.int64)},
        13, "edge_resize")


def graph_cache_argmax() -> onnx.ModelProto:
    """A decoder step's bookkeeping: new rows written into a KV cache by ScatterND at
    run-time positions (negatives count from the end; a repeated position keeps the later
    row), the greedy pick (ArgMax over the last axis, keepdims 0) and the last minimum over
    the positions (ArgMin, axis 0, select_last_index), and class hits written by
    ScatterElements at run-time indices. The arg reductions read the cache itself, so
    every implementation sees the same values and breaks ties the same way."""
    nodes = [
        helper.make_node("ScatterND", ["cache", "pos", "new"], ["cache_out"]),
        helper.make_node("ArgMax", ["cache_out"], ["tokens"], axis=-1, keepdims=0),
        helper.make_node("ArgMin", ["cache_out"], ["worst"], axis=0, keepdims=1, select_last_index=1),
        helper.make_node("ScatterElements", ["counts", "cls", "marks"], ["hits"], axis=1),
    ]
    marks = _rng("cache_argmax").standard_normal((4, 6)).astype(np.float32)
    inputs = [_vi("cache", [64, 32]), _vi("pos", [4, 1], TensorProto.INT64), _vi("new", [4, 32]),
              _vi("counts", [4, 50]), _vi("cls", [4, 6], TensorProto.INT64)]
    outputs = [_vi("cache_out", [64, 32]), _vi("tokens", [64], TensorProto.INT64),
               _vi("worst", [1, 32], TensorProto.INT64), _vi("hits", [4, 50])]
    return _model(nodes, inputs, outputs, {"marks": marks}, 18, "edge_cache_argmax")


def graph_custom_op() -> onnx.ModelProto:
    """A node in a domain nobody implements (com.example::MyCustomOp) between ordinary
    ops. Meant to be reported as unsupported; onnxruntime cannot run it either."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("MyCustomOp", ["r"], ["c"], domain="com.example", alpha=0.5),
        helper.make_node("Add", ["c", "x"], ["y"]),
    ]
    model = _model(nodes, [_vi("x", ["N", 8])], [_vi("y", ["N", 8])], {}, 13,
                   "edge_custom_op", extra_opsets={"com.example": 1})
    return model


# ------------------------------------------------------------------- specs


def _builder(make: Callable[[], onnx.ModelProto]) -> Callable[[str, str], onnx.ModelProto]:
    def build(config: str, dtype: str) -> onnx.ModelProto:
        model = make()
        return to_float16(model) if dtype == "float16" else model
    return build


def _spec(name: str, make: Callable[[], onnx.ModelProto], inputs: dict, outputs: dict,
          ranges: dict | None = None, runs_in_ort: bool = True, note: str = "") -> ModelSpec:
    """A one-config ("tiny") spec; the description is the first paragraph of the
    graph function's docstring."""
    return ModelSpec(
        name=name, family="edge", configs=("tiny",), shapes={"tiny": inputs},
        output_shapes={"tiny": outputs}, builder=_builder(make),
        sources=("models.edge", "models.fp16"),
        runs_in_ort=runs_in_ort, input_ranges={"tiny": ranges or {}},
        description=" ".join((getattr(make, "func", make).__doc__ or "").split("\n\n")[0].split())
        + note)


def specs() -> list[ModelSpec]:
    return [
        _spec("edge-broadcast", graph_broadcast,
              {"x": (N, 3, 4, 8), "row": (4, 1), "col": (8,), "chan": (3, 1, 1)},
              {"y": (N, 3, 4, 8), "outer": (4, 8)}),
        _spec("edge-softmax13", functools.partial(graph_softmax, 13), {"x": (N, 5, 7, 3)},
              {"y": (N, 5, 7, 3), "z": (N, 5, 7, 3)}, note=" Opset 13: one axis."),
        _spec("edge-softmax11", functools.partial(graph_softmax, 11), {"x": (N, 5, 7, 3)},
              {"y": (N, 5, 7, 3), "z": (N, 5, 7, 3)},
              note=" Opset 11: dims from the axis on are flattened and normalised together."),
        _spec("edge-split", graph_split, {"x": (N, 10, 4)},
              {"ya": (N, 2, 4), "yb": (N, 3, 4), "yc": (N, 5, 4)}),
        _spec("edge-gather-neg", graph_gather_neg, {"idx": (3,)}, {"y": (3, 2, 2, 6)},
              ranges={"idx": (-5, 5)}),
        _spec("edge-where-cast-clip", graph_where_cast_clip, {"x": (N, 16), "m": (N, 16)},
              {"z": (N, 16)}, ranges={"m": (0, 3)}),
        _spec("edge-conv-same", graph_conv_same, {"x": (N, 4, 9, 9)}, {"y": (N, 8, 5, 5)}),
        _spec("edge-einsum", graph_einsum,
              {"q": (N, 2, 5, 8), "k": (N, 2, 6, 8), "v": (N, 2, 6, 8)}, {"y": (N, 2, 5, 8)}),
        _spec("edge-resize", graph_resize, {"x": (N, 3, 4, 5)},
              {"up": (N, 3, 8, 10), "lin": (N, 3, 7, 11)}),
        _spec("edge-cache-argmax", graph_cache_argmax,
              {"cache": (64, 32), "pos": (4, 1), "new": (4, 32), "counts": (4, 50), "cls": (4, 6)},
              {"cache_out": (64, 32), "tokens": (64,), "worst": (1, 32), "hits": (4, 50)},
              ranges={"pos": (-64, 64), "cls": (0, 50)}),
        _spec("edge-custom-op", graph_custom_op, {"x": (N, 8)}, {"y": (N, 8)},
              runs_in_ort=False),
    ]
