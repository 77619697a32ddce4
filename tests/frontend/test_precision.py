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


def test_fp32_leaves_the_graph_alone_and_tf32_is_a_clear_error(zoo_cache):
    path = models.build("mlp", "tiny", "float32", cache_dir=zoo_cache)
    graph = import_onnx(path, models.ZOO["mlp"].shapes("tiny"))
    assert with_precision(graph, "fp32") is graph
    with pytest.raises(TilefuseError, match="tf32 products are not implemented yet"):
        with_precision(graph, "tf32")


def test_large_float32_constants_stay_finite_in_fp16():
    """A -1e9 attention mask becomes float16's most negative finite value, not -inf."""
    b = Builder("mask")
    x = b.input("x", TensorType(DType.FLOAT32, (4,)))
    b.output("y", b.map(ScalarFn.ADD, x, b.const(np.full(4, -1e9, np.float32))))
    graph = with_precision(b.graph, "fp16")
    (const,) = graph.constants()
    assert const.type.dtype is DType.FLOAT16 and np.isfinite(const.data).all()
    assert graph.outputs["y"].type.dtype is DType.FLOAT32
