"""``precision="fp16"``/``"bf16"``: a float32 model's arithmetic in a half type, with its
inputs and outputs kept float32; checked against onnxruntime's float32 run at the half
type's tolerance (1e-2 of the output's scale for fp16, 5e-2 for bf16)."""
import random

import numpy as np
import onnxruntime as ort
import pytest

import models
from tilefuse.compare import TOLERANCE, compare_output
from tilefuse.compiler import compile_model
from tilefuse.errors import TilefuseError
from tilefuse.frontend import import_onnx
from tilefuse.frontend.precision import with_precision
from tilefuse.ir import Builder, DType, TensorType
from tilefuse.ir.prims import ScalarFn
from tilefuse.runtime import InferenceSession


@pytest.mark.parametrize("name, precision", [("bert", "fp16"), ("gpt2", "fp16"), ("mlp", "bf16")])
def test_half_precision_plans_match_float32_onnxruntime(name, precision, zoo_cache):
    shapes = models.ZOO[name].shapes("tiny")
    path = models.build(name, "tiny", "float32", cache_dir=zoo_cache)
    compiled = compile_model(path, "cpu", shapes, precision=precision)
    half = {"fp16": DType.FLOAT16, "bf16": DType.BFLOAT16}[precision]
    products = [n for n in compiled.graph.nodes if n.op.name == "MatMul"]
    assert products and all(v.type.dtype is half for n in products for v in n.inputs)
    feeds = models.random_inputs(path, shapes, seed=random.randrange(2**31))
    sess = InferenceSession(compiled.plan)
    assert [i.type for i in sess.get_inputs()] == [f"tensor({'int64' if v.dtype == np.int64 else 'float'})"
                                                  for v in feeds.values()]
    got = sess.run(None, feeds)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype  # outputs keep the model's dtype
        c = compare_output("out", g, w, tolerance=TOLERANCE[half.value])
        assert c.ok, c.problem


def test_fp32_and_tf32_leave_the_graph_alone_and_unknown_precisions_are_clear_errors(zoo_cache):
    path = models.build("mlp", "tiny", "float32", cache_dir=zoo_cache)
    graph = import_onnx(path, models.ZOO["mlp"].shapes("tiny"))
    assert with_precision(graph, "fp32") is graph
    assert with_precision(graph, "tf32") is graph  # tf32 is a property of the products
    with pytest.raises(TilefuseError, match=r"unknown precision 'fp8'; known: \['bf16', 'fp16', 'fp32', 'tf32'\]"):
        with_precision(graph, "fp8")


def test_tf32_products_take_tensor_cores_on_the_gpu_and_stay_exact_on_the_cpu(zoo_cache):
    """Under tf32, float32 product tiles go to T.gemm on the GPU (TF32 MMA) where fp32 keeps
    exact FMA loops; the CPU has no TF32, so its plan is the fp32 plan."""
    from tilefuse.codegen.cuda.emit import emit_tilelang
    from tilefuse.compiler import compile_model
    from tilefuse.frontend.precision import precision_target
    from tilefuse.partition import partition_graph
    from tilefuse.target import CPU, CUDA_SM90A
    from tilefuse.tile_ir.lower import lower_group

    path = models.build("mlp", "tiny", "float32", cache_dir=zoo_cache)
    graph = import_onnx(path, {"x": (128, 64)})  # rows enough for m16 MMA tiles
    for precision, gemm in (("fp32", False), ("tf32", True)):
        target = precision_target(CUDA_SM90A, precision)
        texts = [emit_tilelang(lower_group(g, target).program).text for g in partition_graph(graph, target).groups]
        assert any("T.gemm(" in t for t in texts) is gemm, precision
        if gemm:
            assert all('"float16"' not in t for t in texts)  # operand tiles stay float32
    rng = np.random.default_rng()
    feeds = models.random_inputs(path, models.ZOO["mlp"].shapes("tiny"), seed=int(rng.integers(2**31)))
    from tilefuse.runtime import InferenceSession

    outs = [InferenceSession(compile_model(path, CPU, models.ZOO["mlp"].shapes("tiny"), precision=p).plan).run(None, feeds)
            for p in ("fp32", "tf32")]
    for a, b in zip(*outs):
        np.testing.assert_array_equal(a, b)


def test_large_float32_constants_stay_finite_in_fp16():
    """A -1e9 attention mask becomes float16's most negative finite value, not -inf."""
    b = Builder("mask")
    x = b.input("x", TensorType(DType.FLOAT32, (4,)))
    b.output("y", b.map(ScalarFn.ADD, x, b.const(np.full(4, -1e9, np.float32))))
    graph = with_precision(b.graph, "fp16")
    (const,) = graph.constants()
    assert const.type.dtype is DType.FLOAT16 and np.isfinite(const.data).all()
    assert graph.outputs["y"].type.dtype is DType.FLOAT32
