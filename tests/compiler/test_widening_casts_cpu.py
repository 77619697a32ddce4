"""Widening casts moved into the kernels that read them, through the whole CPU pipeline:
the plan's buffer between the product and the norm is fp16, and the outputs are
bit-identical to the plan that keeps the cast in the product (the cast is exact), and
match onnxruntime within the fp16 tolerance."""
import dataclasses
import functools
import random

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import models
import tilefuse
import tilefuse.compiler
from tilefuse.compare import TOLERANCE, compare_output
from tilefuse.compiler import compile_model
from tilefuse.device import X86_SERVER
from tilefuse.partition import partition_graph
from tilefuse.target import CPU

ROWS, K, COLS = 16, 64, 4096  # two kernels on the CPU: the norm's whole rows stay apart
# the CPU target with its assumed caches, not this host's (a native plan takes the host's
# L2, and on a 512 KB one the cost model moves the norm's own widening cast in the
# narrowing case too): what moves must not depend on the machine the tests run on
ASSUMED = dataclasses.replace(CPU, device=dataclasses.replace(X86_SERVER, name=f"{X86_SERVER.name} (assumed)"))


def _norm_model(*, wide_output=False, square_output=False, narrowing=False, product_after=False):
    """MatMul, Add, Cast(fp32), LayerNorm written out with ReduceMean, Cast(fp16)."""
    narrow, wide = (TensorProto.FLOAT, TensorProto.FLOAT16) if narrowing else (TensorProto.FLOAT16, TensorProto.FLOAT)
    nt, wt = onnx.helper.tensor_dtype_to_np_dtype(narrow), onnx.helper.tensor_dtype_to_np_dtype(wide)
    rng = np.random.default_rng(1)
    inits = [
        onnx.numpy_helper.from_array((rng.standard_normal((K, COLS)) * 0.2).astype(nt), "w"),
        onnx.numpy_helper.from_array(rng.standard_normal(COLS).astype(nt), "b"),
        onnx.numpy_helper.from_array(np.array(1e-5, wt), "eps"),
        onnx.numpy_helper.from_array(np.array(2, wt), "two"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["s"]),
        helper.make_node("Cast", ["s"], ["v"], to=wide),
        helper.make_node("ReduceMean", ["v"], ["mean"], axes=[-1]),
        helper.make_node("Sub", ["v", "mean"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["d2"]),
        helper.make_node("ReduceMean", ["d2"], ["var"], axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Div", ["d", "sd"], ["n"]),
        helper.make_node("Cast", ["n"], ["y"], to=narrow),
    ]
    outputs = [helper.make_tensor_value_info("y", narrow, [2, ROWS // 2, COLS])]
    if wide_output:
        outputs.append(helper.make_tensor_value_info("v", wide, [2, ROWS // 2, COLS]))
    if square_output:
        nodes += [helper.make_node("Mul", ["v", "v"], ["vv"]), helper.make_node("Cast", ["vv"], ["sq"], to=narrow)]
        outputs.append(helper.make_tensor_value_info("sq", narrow, [2, ROWS // 2, COLS]))
    if product_after:  # a second reader: a float32 product whose prologue becomes the cast
        inits.append(onnx.numpy_helper.from_array((rng.standard_normal((COLS, 8)) * 0.02).astype(wt), "w2"))
        nodes.append(helper.make_node("MatMul", ["v", "w2"], ["p"]))
        outputs.append(helper.make_tensor_value_info("p", wide, [2, ROWS // 2, 8]))
    graph = helper.make_graph(nodes, "norm", [helper.make_tensor_value_info("x", narrow, [2, ROWS // 2, K])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(path, feeds, *, move, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(tilefuse.compiler, "partition_graph", functools.partial(partition_graph, move_casts=move))
        compiled = compile_model(path, ASSUMED, {k: v.shape for k, v in feeds.items()})
    session = tilefuse.InferenceSession(compiled.plan)
    return compiled, dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def _buffers(compiled, step):
    plan = compiled.plan
    return [plan.buffers[b] for b in step.inputs if plan.buffers[b].kind.value != "constant"], \
        [plan.buffers[b] for b in step.outputs]


CASES = {
    "norm": {},
    "wide_output": {"wide_output": True},
    "square_output": {"square_output": True},
    "product_after": {"product_after": True},
    "narrowing": {"narrowing": True, "product_after": True},
}


@pytest.mark.parametrize("case", list(CASES))
def test_moved_casts_give_identical_outputs(case, tmp_path, monkeypatch):
    path = tmp_path / f"{case}.onnx"
    onnx.save(_norm_model(**CASES[case]), path)
    dtype = np.float32 if case == "narrowing" else np.float16
    feeds = {"x": np.random.default_rng(random.randrange(2**31)).standard_normal((2, ROWS // 2, K)).astype(dtype)}
    kept, want = _run(path, feeds, move=False, monkeypatch=monkeypatch)
    moved, got = _run(path, feeds, move=True, monkeypatch=monkeypatch)
    for name, w in want.items():
        assert got[name].dtype == w.dtype and np.array_equal(got[name], w, equal_nan=True), name
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for name, w in zip([o.name for o in ref.get_outputs()], ref.run(None, feeds)):
        c = compare_output(name, got[name], w, TOLERANCE["float16"])  # fp32 outputs hold fp16 sums
        assert c.ok, f"{case}: {name}: {c.problem}"

    first = moved.plan.steps[0]
    _, written = _buffers(moved, first)
    readers_in = [b for s in moved.plan.steps[1:] for b in _buffers(moved, s)[0]]
    wide = [b for b in written if str(b.type.dtype) == "float32"]
    if case in ("norm", "square_output", "product_after"):
        assert wide == [] and all(str(b.type.dtype) == "float16" for b in readers_in)
        assert sum(b.nbytes for b in written) < sum(b.nbytes for b in _buffers(kept, kept.plan.steps[0])[1])
    elif case == "wide_output":  # the graph output keeps its dtype and its producer
        assert [b.name for b in wide] == ["v"] and moved.plan.buffers[moved.plan.outputs[1].buffer].name == "v"
    else:  # narrowing: nothing moves
        assert [b.type for b in written] == [b.type for b in _buffers(kept, kept.plan.steps[0])[1]]


@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_half_zoo_models_unchanged_and_match_onnxruntime(name, zoo_cache, monkeypatch):
    """The tiny fp16 transformers fuse their norms into the products on the CPU, so no cast
    moves there; the plans must still agree bit for bit and with onnxruntime."""
    shapes = models.ZOO[name].shapes("tiny")
    path = models.build(name, "tiny", "float16", cache_dir=zoo_cache)
    feeds = models.random_inputs(path, shapes, seed=random.randrange(2**31))
    _, want = _run(path, feeds, move=False, monkeypatch=monkeypatch)
    _, got = _run(path, feeds, move=True, monkeypatch=monkeypatch)
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for out, w in zip([o.name for o in ref.get_outputs()], ref.run(None, feeds)):
        assert np.array_equal(got[out], want[out], equal_nan=True), out
        c = compare_output(out, got[out], w)
        assert c.ok, f"{name}: {out}: {c.problem}"
