"""Loss, quantization, RoPE, LRN, SwiGLU and CumProd converters against onnxruntime.

Each case is one ONNX node; runtime inputs get fresh random values, initializers
stand for weights and compile-time operands. The imported graph runs on the reference
executor. SwiGLU has no onnxruntime kernel, so it is checked against onnx's reference.
"""
from __future__ import annotations


import numpy as np
import onnx
import pytest
from onnx import helper as h
from onnx.reference import ReferenceEvaluator

from tilefuse.frontend import import_onnx
from tilefuse.ir.prims import Kind
from tilefuse.reference import run_graph
from tests.frontend.node_cases import Case, C, assert_matches, case_inputs, one_node_model, onnxruntime_outputs

RNG = np.random.default_rng()
F32, F16 = np.float32, np.float16
U8, I8, I16, U16, I32, I64 = np.uint8, np.int8, np.int16, np.uint16, np.int32, np.int64


def rand(*shape: int, dtype: type = F32, positive: bool = False) -> np.ndarray:
    """Random floats, never all zeros."""
    x = RNG.standard_normal(shape) + 0.1
    return (np.abs(x) + 0.5 if positive else x).astype(dtype)


def ints(*shape: int, dtype: type = U8, low: int | None = None, high: int | None = None) -> np.ndarray:
    """Random integers over the dtype's range (or ``[low, high)``)."""
    info = np.iinfo(dtype)
    lo = info.min if low is None else low
    hi = info.max + 1 if high is None else high
    return RNG.integers(lo, hi, size=shape).astype(dtype)


def labels(*shape: int, classes: int, ignore: int | None = None) -> np.ndarray:
    """Class labels in ``[0, classes)``, some replaced by ``ignore`` when given."""
    t = RNG.integers(0, classes, size=shape).astype(I64)
    if ignore is not None:
        t.flat[:: 3] = ignore
    return t


def scale(*shape: int, dtype: type = F32) -> np.ndarray:
    return (RNG.random(shape) * 0.05 + 0.01).astype(dtype)


def build(case: Case) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    names, graph_inputs, inits, feeds = case_inputs(case)
    outs = [f"out{i}" for i in range(case.outputs)]
    node = h.make_node(case.op, names, outs, **case.attrs)
    m = one_node_model(case, node, graph_inputs, inits, outs)
    inferred = onnx.shape_inference.infer_shapes(m)
    del m.graph.output[:]
    m.graph.output.extend(inferred.graph.output)
    if any(not o.type.tensor_type.HasField("shape") for o in m.graph.output):
        # Shapes onnx cannot infer (from a constant operand) come from running the node.
        results = expected(m, feeds, onnx_reference=False)
        del m.graph.output[:]
        m.graph.output.extend(h.make_tensor_value_info(k, h.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in results.items())
    return m, feeds


def expected(model: onnx.ModelProto, feeds: dict[str, np.ndarray], onnx_reference: bool) -> dict[str, np.ndarray]:
    names = [o.name for o in model.graph.output]
    if onnx_reference:
        return dict(zip(names, ReferenceEvaluator(model).run(None, feeds)))
    return onnxruntime_outputs(model, feeds)


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], onnx_reference: bool = False) -> None:
    graph = import_onnx(model, {k: v.shape for k, v in feeds.items()})
    got = run_graph(graph, feeds)
    assert_matches(got, expected(model, feeds, onnx_reference))


def nll(id: str, inputs: list, **attrs) -> Case:
    return Case(id, "NegativeLogLikelihoodLoss", inputs, attrs, opset=13)


def sce(id: str, inputs: list, outputs: int = 1, **attrs) -> Case:
    return Case(id, "SoftmaxCrossEntropyLoss", inputs, attrs, outputs=outputs, opset=13)


LOSSES = [
    nll("nll_2d_none", [rand(4, 5), labels(4, classes=5)], reduction="none"),
    nll("nll_3d_mean_weight", [rand(2, 5, 3), labels(2, 3, classes=5), rand(5, positive=True)]),
    nll("nll_3d_sum_ignore", [rand(2, 5, 3), labels(2, 3, classes=5, ignore=1)], reduction="sum", ignore_index=1),
    nll("nll_4d_mean_negative_ignore", [rand(2, 4, 3, 2), labels(2, 3, 2, classes=4, ignore=-1)], ignore_index=-1),
    nll("nll_mean_weight_ignore_out_of_range", [rand(3, 4, 5), labels(3, 5, classes=4, ignore=10), rand(4, positive=True)],
        ignore_index=10),
    nll("nll_int32_labels", [rand(3, 6), labels(3, classes=6).astype(I32)], reduction="sum"),
    nll("nll_f16_mean_weight", [rand(2, 5, 4, dtype=F16), labels(2, 4, classes=5), rand(5, dtype=F16, positive=True)]),
    sce("sce_2d_mean_log_prob", [rand(4, 7), labels(4, classes=7)], outputs=2),
    sce("sce_3d_sum", [rand(2, 5, 3), labels(2, 3, classes=5)], reduction="sum"),
    sce("sce_4d_none_weight_ignore", [rand(2, 3, 4, 2), labels(2, 4, 2, classes=3, ignore=2), rand(3, positive=True)],
        outputs=2, reduction="none", ignore_index=2),
    sce("sce_mean_ignore_no_weight", [rand(5, 4, 3), labels(5, 3, classes=4, ignore=-5)], ignore_index=-5),
    sce("sce_f16_mean_log_prob", [rand(3, 6, 2, dtype=F16), labels(3, 2, classes=6)], outputs=2),
]

# Values half-way between integers test round-half-to-even; large ones test saturation.
TIES = np.array([[0.5, 1.5, 2.5, -0.5], [-1.5, -2.5, 1000.0, -1000.0]], F32)

QUANT = [
    C("quantize_uint8_default", "QuantizeLinear", [rand(3, 4), np.array(0.02, F32)], consts=(1,), opset=13),
    C("quantize_ties_saturate_int8", "QuantizeLinear", [TIES, np.array(1.0, F32), np.array(0, I8)], consts=(1, 2), opset=13),
    C("quantize_ties_uint8_zp", "QuantizeLinear", [TIES, np.array(1.0, F32), np.array(128, U8)], consts=(1, 2), opset=13),
    C("quantize_per_axis", "QuantizeLinear", [rand(2, 3, 4), scale(3), ints(3, dtype=I8, low=-10, high=10)], consts=(1, 2),
      opset=13),
    C("quantize_per_axis_last", "QuantizeLinear", [rand(2, 3, 4), scale(4), ints(4, dtype=U8, low=100, high=150)],
      consts=(1, 2), opset=13, axis=-1),
    C("quantize_runtime_scale", "QuantizeLinear", [rand(3, 5), scale(1), ints(1, dtype=U8)], opset=13),
    C("quantize_int16", "QuantizeLinear", [rand(4, 6) * 100, np.array(0.001, F32), np.array(-7, I16)], consts=(1, 2),
      opset=21),
    C("quantize_uint16", "QuantizeLinear", [rand(4, 6) * 10, np.array(0.0005, F32), np.array(30000, U16)], consts=(1, 2),
      opset=21),
    C("quantize_blocked", "QuantizeLinear", [rand(3, 8), scale(3, 2), ints(3, 2, dtype=I8, low=-5, high=5)], consts=(1, 2),
      opset=21, axis=1, block_size=4),
    C("quantize_f16", "QuantizeLinear", [rand(4, 8, dtype=F16), np.array(0.03, F16), np.array(5, I8)], consts=(1, 2),
      opset=21),
    C("dequantize_uint8", "DequantizeLinear", [ints(3, 4), np.array(0.05, F32), np.array(120, U8)], consts=(1, 2), opset=13),
    C("dequantize_per_axis", "DequantizeLinear", [ints(2, 3, 4, dtype=I8), scale(3), ints(3, dtype=I8, low=-9, high=9)],
      consts=(1, 2), opset=13),
    C("dequantize_int32", "DequantizeLinear", [ints(5, 3, dtype=I32, low=-5000, high=5000), np.array(0.002, F32)],
      consts=(1,), opset=13),
    C("dequantize_blocked", "DequantizeLinear", [ints(6, 4, dtype=U8), scale(2, 4), ints(2, 4, dtype=U8)], consts=(1, 2),
      opset=21, axis=0, block_size=3),
    C("dequantize_int16_f16_scale", "DequantizeLinear", [ints(4, 5, dtype=I16), np.array(0.01, F16), np.array(-3, I16)],
      consts=(1, 2), opset=21),
    C("dequantize_runtime_scale", "DequantizeLinear", [ints(3, 7, dtype=I8), scale(1), ints(1, dtype=I8)], opset=13),
    C("dynamic_quantize", "DynamicQuantizeLinear", [rand(3, 5)], outputs=3, opset=11),
    C("dynamic_quantize_positive", "DynamicQuantizeLinear", [rand(4, 4, positive=True)], outputs=3, opset=11),
]

# onnxruntime's uint8 x int8 kernels on AVX2 add products in pairs in int16, with
# saturation; the operands of those cases stay small enough that it cannot saturate.
INTEGER = [
    C("matmulinteger_u8_i8", "MatMulInteger", [ints(3, 4, high=128), ints(4, 5, dtype=I8, low=-64, high=64),
                                               np.array(7, U8), np.array(-3, I8)],
      consts=(2, 3), opset=10),
    C("matmulinteger_no_zero_points", "MatMulInteger", [ints(4, 8, dtype=I8), ints(8, 3, dtype=I8)], opset=10),
    C("convinteger_pads", "ConvInteger", [ints(1, 3, 5, 5), ints(4, 3, 3, 3), np.array(100, U8), np.array(3, U8)],
      consts=(2, 3), opset=10, pads=[1, 1, 1, 1]),
    C("convinteger_strided_group", "ConvInteger", [ints(2, 4, 7, 6), ints(4, 2, 2, 3)], consts=(1,), opset=10,
      strides=[2, 1], group=2),
    C("qlinearmatmul_u8", "QLinearMatMul",
      [ints(3, 8), np.array(0.02, F32), np.array(120, U8), ints(8, 5), np.array(0.01, F32), np.array(130, U8),
       np.array(0.3, F32), np.array(128, U8)], consts=(1, 2, 4, 5, 6, 7), opset=10),
    C("qlinearmatmul_s8_batched", "QLinearMatMul",
      [ints(2, 3, 8, dtype=I8), np.array(0.03, F32), np.array(-2, I8), ints(8, 4, dtype=I8), np.array(0.02, F32),
       np.array(0, I8), np.array(0.5, F32), np.array(3, I8)], consts=(1, 2, 4, 5, 6, 7), opset=21),
    C("qlinearmatmul_f16_scales", "QLinearMatMul",
      [ints(4, 16), np.array(0.0213, F16), np.array(120, U8), ints(16, 6), np.array(0.0117, F16), np.array(130, U8),
       np.array(0.3, F16), np.array(128, U8)], consts=(1, 2, 4, 5, 6, 7), opset=21),
    C("qlinearconv_bias", "QLinearConv",
      [ints(1, 3, 6, 6, high=128), np.array(0.02, F32), np.array(64, U8), ints(4, 3, 3, 3, dtype=I8, low=-64, high=64),
       np.array(0.01, F32),
       np.array(0, I8), np.array(0.2, F32), np.array(120, U8), ints(4, dtype=I32, low=-500, high=500)],
      consts=(1, 2, 4, 5, 6, 7, 8), opset=10, pads=[1, 1, 1, 1]),
    C("qlinearconv_per_channel", "QLinearConv",
      [ints(2, 2, 5, 5, dtype=I8), np.array(0.05, F32), np.array(1, I8), ints(3, 2, 2, 2, dtype=I8), scale(3),
       np.zeros(3, I8), np.array(0.4, F32), np.array(-1, I8)], consts=(1, 2, 4, 5, 6, 7), opset=10, strides=[2, 2]),
]


def rope(id: str, inputs: list, **attrs) -> Case:
    return Case(id, "RotaryEmbedding", inputs, attrs, opset=23)


ROTARY = [
    rope("rope_4d", [rand(2, 3, 5, 8), rand(2, 5, 4), rand(2, 5, 4)]),
    rope("rope_4d_interleaved_positions", [rand(2, 3, 5, 8), rand(10, 4), rand(10, 4), ints(2, 5, dtype=I64, low=0, high=10)],
         interleaved=1),
    rope("rope_3d_heads_positions", [rand(2, 4, 24), rand(9, 3), rand(9, 3), ints(2, 4, dtype=I64, low=0, high=9)],
         num_heads=4),
    rope("rope_3d_partial_interleaved", [rand(1, 6, 32), rand(1, 6, 2), rand(1, 6, 2)], num_heads=2,
         rotary_embedding_dim=4, interleaved=1),
    rope("rope_4d_partial", [rand(1, 2, 3, 16), rand(1, 3, 4), rand(1, 3, 4)], rotary_embedding_dim=8),
    rope("rope_f16", [rand(1, 2, 4, 8, dtype=F16), rand(1, 4, 4, dtype=F16), rand(1, 4, 4, dtype=F16)]),
]

OTHER = [
    C("lrn_default", "LRN", [rand(2, 5, 3, 3)], size=3),
    C("lrn_f16", "LRN", [rand(1, 6, 3, 3, dtype=F16)], size=5, alpha=0.1),
    C("cumprod_axis1", "CumProd", [rand(3, 5), np.array(1, I64)], consts=(1,), opset=26),
    C("cumprod_exclusive_reverse", "CumProd", [rand(2, 4, 3), np.array(-2, I64)], consts=(1,), opset=26,
      exclusive=1, reverse=1),
    C("cumprod_exclusive_zeros", "CumProd", [np.array([[2.0, 0.0, 3.0, -4.0], [0.5, 1.5, 0.0, 2.0]], F32), np.array(1, I64)],
      consts=(1,), opset=26, exclusive=1),
    C("cumprod_int32", "CumProd", [ints(4, 3, dtype=I32, low=-3, high=4), np.array(0, I32)], consts=(1,), opset=26),
]

def grid(*shape: int) -> np.ndarray:
    """Normalized sampling positions, some outside [-1, 1] to exercise the padding."""
    return (RNG.random(shape) * 3.0 - 1.5).astype(F32)


def gs(id: str, inputs: list, opset: int = 20, **attrs) -> Case:
    return Case(id, "GridSample", inputs, attrs, opset=opset)


def unpool_indices(n: int, c: int, h: int, w: int) -> np.ndarray:
    """MaxPool-style flat indices of one position in each 2x2 window of an [n, c, h, w] input."""
    dy, dx = RNG.integers(0, 2, size=(2, n, c, h // 2, w // 2))
    rows = np.arange(h // 2)[:, None] * 2 + dy
    cols = np.arange(w // 2)[None, :] * 2 + dx
    plane = np.arange(n * c).reshape(n, c, 1, 1) * h * w
    return (plane + rows * w + cols).astype(I64)


SPATIAL = [
    gs("gridsample_linear_zeros", [rand(2, 3, 5, 6), grid(2, 4, 3, 2)]),
    gs("gridsample_linear_border_aligned", [rand(1, 2, 4, 4), grid(1, 3, 5, 2)], padding_mode="border", align_corners=1),
    gs("gridsample_linear_reflection", [rand(1, 2, 4, 5), grid(1, 6, 2, 2)], padding_mode="reflection"),
    gs("gridsample_nearest_zeros", [rand(2, 2, 5, 4), grid(2, 3, 3, 2)], mode="nearest"),
    gs("gridsample_nearest_reflection_aligned", [rand(1, 3, 4, 4), grid(1, 4, 4, 2)], mode="nearest",
       padding_mode="reflection", align_corners=1),
    gs("gridsample_cubic_zeros", [rand(1, 2, 6, 5), grid(1, 3, 4, 2)], mode="cubic"),
    gs("gridsample_cubic_border", [rand(2, 1, 5, 5), grid(2, 2, 3, 2)], mode="cubic", padding_mode="border"),
    gs("gridsample_cubic_reflection_aligned", [rand(1, 2, 5, 6), grid(1, 4, 2, 2)], mode="cubic",
       padding_mode="reflection", align_corners=1),
    gs("gridsample_bilinear_opset16", [rand(1, 2, 4, 4), grid(1, 3, 3, 2)], opset=16, mode="bilinear"),
    gs("gridsample_volumetric_linear_reflection", [rand(1, 2, 3, 4, 5), grid(1, 2, 3, 2, 3)], padding_mode="reflection"),
    gs("gridsample_f16", [rand(1, 2, 4, 4, dtype=F16), grid(1, 3, 3, 2).astype(F16)]),
    C("maxunpool", "MaxUnpool", [rand(2, 3, 2, 3), unpool_indices(2, 3, 4, 6)], opset=11, kernel_shape=[2, 2], strides=[2, 2]),
    C("maxunpool_output_shape", "MaxUnpool", [rand(1, 2, 2, 2), unpool_indices(1, 2, 5, 5), np.array([1, 2, 5, 5], I64)],
      consts=(2,), opset=11, kernel_shape=[2, 2], strides=[2, 2]),
    C("col2im", "Col2Im", [rand(2, 3 * 4, 12), np.array([4, 5], I64), np.array([2, 2], I64)], consts=(1, 2), opset=18),
    C("col2im_strides_pads_dilations", "Col2Im", [rand(1, 2 * 6, 9), np.array([5, 6], I64), np.array([2, 3], I64)],
      consts=(1, 2), opset=18, strides=[2, 2], pads=[1, 0, 1, 1], dilations=[2, 1]),
]

SWIGLU = [
    C("swiglu", "SwiGLU", [rand(3, 8), rand(3, 8)], opset=28),
    C("swiglu_alpha", "SwiGLU", [rand(2, 3, 4), rand(2, 3, 4)], opset=28, alpha=1.702),
    C("swiglu_f16", "SwiGLU", [rand(4, 6, dtype=F16), rand(4, 6, dtype=F16)], opset=28),
]


@pytest.mark.parametrize("case", LOSSES + QUANT + INTEGER + ROTARY + OTHER + SPATIAL, ids=lambda c: c.id)
def test_against_onnxruntime(case: Case) -> None:
    check(*build(case))


@pytest.mark.parametrize("case", SWIGLU, ids=lambda c: c.id)
def test_against_onnx_reference(case: Case) -> None:
    check(*build(case), onnx_reference=True)


def run(case: Case) -> list[np.ndarray]:
    model, feeds = build(case)
    got = run_graph(import_onnx(model, {k: v.shape for k, v in feeds.items()}), feeds)
    return [got[o.name] for o in model.graph.output]


def test_matmulinteger_per_row_and_column_zero_points() -> None:
    """A vector zero point of A applies to its rows, one of B to its columns (onnxruntime
    takes only scalars, so numpy is the oracle)."""
    a, c, za, zc = ints(2, 3, 6), ints(6, 4), ints(3), ints(4)
    (got,) = run(C("mmi_rows", "MatMulInteger", [a, c, za, zc], consts=(2, 3), opset=10))
    want = (a.astype(I32) - za.astype(I32)[:, None]) @ (c.astype(I32) - zc.astype(I32))
    np.testing.assert_array_equal(got, want)


def test_lrn_even_size() -> None:
    """An even window reaches one channel further up than down (onnxruntime takes odd
    sizes only, so the spec's formula is the oracle)."""
    x, size, alpha, beta, bias = rand(1, 7, 4, 2), 4, 0.01, 0.6, 2.0
    (got,) = run(C("lrn_even", "LRN", [x], size=size, alpha=alpha, beta=beta, bias=bias))
    squares = np.zeros_like(x)
    for c in range(x.shape[1]):
        lo, hi = max(0, c - (size - 1) // 2), min(x.shape[1], c + size // 2 + 1)
        squares[:, c] = (x[:, lo:hi] ** 2).sum(axis=1)
    np.testing.assert_allclose(got, x / (bias + alpha / size * squares) ** beta, rtol=1e-5, atol=1e-6)


def test_integer_matmul_accumulates_in_int32() -> None:
    """The contraction itself is an int32 MatMul, not a float one."""
    model, feeds = build(INTEGER[0])
    graph = import_onnx(model, {k: v.shape for k, v in feeds.items()})
    (mm,) = [n for n in graph.nodes if n.op.kind is Kind.CONTRACT]
    assert all(str(v.type.dtype) == "int32" for v in mm.inputs)


def test_lrn_is_one_window_reduction() -> None:
    """LRN's channel sum is a single WindowReduce, with no transposes around it."""
    model, feeds = build(OTHER[0])
    graph = import_onnx(model, {k: v.shape for k, v in feeds.items()})
    kinds = [n.op.kind for n in graph.nodes]
    assert kinds.count(Kind.REDUCE) == 1 and Kind.INDEX not in kinds
