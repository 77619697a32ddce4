"""Quantized (QDQ) products become integer products where the target has them
(frontend/qdq.py): the rewritten model computes what the QDQ model does, products that do
not qualify are left alone, and a CPU plan of a QDQ model matches onnxruntime and the
reference on fresh random inputs."""
from __future__ import annotations

import random

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tilefuse
from tilefuse.compare import compare_output
from tilefuse.frontend import import_onnx, qdq
from tilefuse.reference import run_graph
from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import MatMul
from tilefuse.target import CPU, CUDA_SM90A


def qdq_product(m: int, k: int, n: int, *, column_scales: bool = False, weight_zero: int = 0, axis: int = 1,
                weight_input: bool = False, scale_dtype=np.float32, norm: bool = False) -> onnx.ModelProto:
    """x [m, k] float -> QuantizeLinear(uint8) -> DequantizeLinear, times DequantizeLinear
    of int8 W [k, n], plus a bias (and a LayerNormalization where ``norm``): what
    quantize_static writes for one MatMul."""
    rng = np.random.default_rng(7)
    w = rng.integers(-127, 128, (k, n)).astype(np.int8)
    s_w = (rng.uniform(0.5, 2.0, n if column_scales else ()) / 127).astype(scale_dtype)
    inits = [numpy_helper.from_array(w, "w_q"), numpy_helper.from_array(np.array(0.03, scale_dtype), "s_x"),
             numpy_helper.from_array(np.array(128, np.uint8), "z_x"), numpy_helper.from_array(s_w, "s_w"),
             numpy_helper.from_array(np.full(s_w.shape, weight_zero, np.int8), "z_w"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "bias")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s_x", "z_x"], ["x_q"]),
             helper.make_node("DequantizeLinear", ["x_q", "s_x", "z_x"], ["x_dq"]),
             helper.make_node("DequantizeLinear", ["w_q", "s_w", "z_w"], ["w_dq"], axis=axis),
             helper.make_node("MatMul", ["x_dq", "w_dq"], ["p"]),
             helper.make_node("Add", ["p", "bias"], ["pb" if norm else "y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])]
    if norm:
        inits += [numpy_helper.from_array(rng.uniform(0.5, 1.5, n).astype(np.float32), "gamma"),
                  numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "beta")]
        nodes.append(helper.make_node("LayerNormalization", ["pb", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5))
    if weight_input:  # the weight fed at run time, not a constant
        inits = [t for t in inits if t.name != "w_q"]
        inputs.append(helper.make_tensor_value_info("w_q", TensorProto.INT8, [k, n]))
    graph = helper.make_graph(nodes, "qdq", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def _run(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # as written
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.mark.parametrize("column_scales", [False, True], ids=["tensor-scale", "column-scales"])
def test_rewrite_computes_what_the_qdq_model_does(column_scales):
    model = qdq_product(9, 70, 24, column_scales=column_scales)
    rewritten = qdq.integer_products(model)
    ops = [n.op_type for n in rewritten.graph.node]
    assert "MatMul" not in ops and ops.count("MatMulInteger") == 1
    onnx.checker.check_model(rewritten)
    seed = random.randrange(2**31)
    x = np.random.default_rng(seed).standard_normal((9, 70)).astype(np.float32)
    # the rewritten model by the reference: onnxruntime's U8S8 kernel saturates its int16
    # pairs on AVX2 hosts without VNNI (tests/tile_ir/test_int8_panels.py)
    want, got = _run(model, {"x": x}), next(iter(run_graph(import_onnx(rewritten), {"x": x}).values()))
    # the same exact integer sum, rounded once instead of once a term
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=f"seed={seed}")


@pytest.mark.parametrize("case", [dict(weight_zero=3), dict(column_scales=True, axis=0), dict(weight_input=True),
                                  dict(scale_dtype=np.float16)],
                         ids=["weight-zero-point", "row-scales", "weight-fed", "float16-scales"])
def test_products_that_are_not_integer_products_are_left_alone(case):
    if case.get("axis") == 0:  # a scale per row of W: k scales
        model = qdq_product(8, 24, 24, **case)
    else:
        model = qdq_product(8, 24, 16, **case)
    assert qdq.integer_products(model) is model


@pytest.mark.parametrize("shape", [(1, 64, 32), (37, 70, 100), (128, 256, 96), (5, 13, 33)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("norm", [False, True], ids=["bias", "bias-layernorm"])
def test_cpu_plan_of_a_qdq_product_matches_onnxruntime_and_the_reference(shape, norm):
    """The LayerNorm after the product checks its row sums are float, not the product's int32."""
    m, k, n = shape
    model = qdq_product(m, k, n, column_scales=True, norm=norm)
    assert _int32_products(import_onnx(model, integer_products=True)) == 1
    plan = tilefuse.compile(model.SerializeToString(), target="cpu")
    seed = random.randrange(2**31)
    feeds = {"x": np.random.default_rng(seed).standard_normal((m, k)).astype(np.float32)}
    (got,) = tilefuse.InferenceSession(plan).run(None, feeds)
    want_ort = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    (want_ref,) = run_graph(import_onnx(model), feeds).values()
    for what, want in (("onnxruntime", want_ort), ("reference", want_ref)):
        c = compare_output("y", got, want)
        assert c.ok, f"{shape} seed={seed} against {what}: {c.problem}"


def test_gpu_targets_keep_qdq_products_in_float():
    assert CPU.gemm.integer_products and not CUDA_SM90A.gemm.integer_products
    assert _int32_products(import_onnx(qdq_product(8, 32, 16))) == 0  # the importer's default: as written


def _int32_products(graph) -> int:
    return sum(isinstance(n.op, MatMul) and n.outputs[0].type.dtype is DType.INT32 for n in graph.nodes)
