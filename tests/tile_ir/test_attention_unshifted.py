"""Attention whose softmax is written without its max shift, ``exp(x) / sum(exp(x))``, as
some exporters write it: one flash kernel that keeps only the running sum (no max, no
rescale), on the CPU and on the GPU. It was merged by the partitioner, refused by the
attention lowering and run staged (one thread on the CPU). An argument with another
reduction in it (``exp(x - mean(x))``) is not a softmax the kernel can stream: refused,
and the plan still matches onnxruntime."""
import random

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tilefuse
from tilefuse.compare import compare_output
from tilefuse.compiler import compile_model
from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.patterns import AttentionMatch, Refusal
from tilefuse.patterns.attention import match_attention
from tilefuse.reference import evaluate_all
from tilefuse.target import CPU, CUDA_SM90A
from tilefuse.tile_ir.lower import lower_group

from tests.tile_ir.interpreted import interpret
from tests.tile_ir.test_attention_tails import _feeds  # q, k, v and a key mask that keeps key 0


def unshifted_attention(seq: int, heads: int = 2, d: int = 16, dtype: str = "float32", centre: str = "") -> bytes:
    """exp(q k^T * scale + mask) / sum(...) @ v over [1, heads, seq, d]; ``centre``: "mean"
    subtracts the row mean before the exp, "const" a constant."""
    elem = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}[dtype]
    io = {n: helper.make_tensor_value_info(n, elem, [1, heads, seq, d]) for n in ("q", "k", "v", "y")}
    mask = helper.make_tensor_value_info("mask", elem, [1, 1, 1, seq])
    inits = [numpy_helper.from_array(np.array(d ** -0.5, dtype), "scale"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes"),
             numpy_helper.from_array(np.array(0.5, dtype), "half")]
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Mul", ["s", "scale"], ["s2"]),
             helper.make_node("Add", ["s2", "mask"], ["s3"])]
    if centre == "mean":
        nodes += [helper.make_node("ReduceMean", ["s3"], ["mu"], axes=[-1], keepdims=1),
                  helper.make_node("Sub", ["s3", "mu"], ["x"])]
    elif centre == "const":
        nodes += [helper.make_node("Sub", ["s3", "half"], ["x"])]
    else:
        nodes += [helper.make_node("Identity", ["s3"], ["x"])]
    nodes += [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("ReduceSum", ["e", "axes"], ["z"], keepdims=1),
              helper.make_node("Div", ["e", "z"], ["p"]), helper.make_node("MatMul", ["p", "v"], ["y"])]
    graph = helper.make_graph(nodes, "attention", [io["q"], io["k"], io["v"], mask], [io["y"]], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _groups(model, target):
    return [g for g in partition_graph(import_onnx(model), target).groups if str(g.kind) != "opaque"]


@pytest.mark.parametrize("seq", [32, 128, 197])
@pytest.mark.parametrize("centre", ["", "const"])
@pytest.mark.parametrize("target, dtype", [(CPU, "float32"), (CUDA_SM90A, "float32"), (CUDA_SM90A, "float16")])
def test_unshifted_softmax_attention_is_one_flash_kernel_that_interprets_like_the_reference(seq, centre, target, dtype):
    heads, d = 2, 16
    model = unshifted_attention(seq, heads, d, dtype, centre)
    (group,) = _groups(model, target)
    assert isinstance(group.match, AttentionMatch) and not group.match.softmax.shifted, group.match
    lowered = lower_group(group, target)
    p = lowered.program
    assert p.notes[0].startswith("flash attention") and "softmax without a max shift" in p.notes[0], p.notes
    assert p.threads >= 64 and not any(b.name in ("row_max", "rescale") for b in p.allocs), p.allocs
    seed = random.randrange(2**31)
    graph = import_onnx(model)
    values = evaluate_all(graph, _feeds(seq, heads, d, dtype, seed))
    (group,) = [g for g in partition_graph(graph, target).groups if str(g.kind) != "opaque"]
    for v, got in interpret(lower_group(group, target), values):
        c = compare_output(v.name, got, values[id(v)])
        assert c.ok, f"seq {seq} {target.name} {dtype} seed={seed}: {c.problem}"


@pytest.mark.parametrize("seq", [64, 197])
def test_unshifted_attention_runs_on_the_cpu_like_onnxruntime(seq, tmp_path):
    heads, d = 3, 32
    model = unshifted_attention(seq, heads, d)
    compiled = compile_model(model, "cpu")
    kinds = [type(g.match).__name__ for g in compiled.partition.groups if str(g.kind) != "opaque"]
    assert kinds == ["AttentionMatch"], kinds
    _runs_like_onnxruntime(model, compiled, (seq, heads, d), tmp_path)


def test_a_softmax_of_a_centred_argument_is_refused_and_the_plan_still_matches(tmp_path):
    """exp(x - mean(x)) / sum(...): a reduction inside the argument, not a row max it
    subtracts; the kernel cannot compute it from one score tile."""
    seq, heads, d = 48, 2, 16
    model = unshifted_attention(seq, heads, d, centre="mean")
    graph = import_onnx(model)
    nodes = list(graph.nodes)
    found = match_attention(nodes, graph.outputs, CPU)
    assert isinstance(found, Refusal) and "inside softmax's argument" in found.reason, found
    compiled = compile_model(model, "cpu")
    assert not any(isinstance(g.match, AttentionMatch) for g in compiled.partition.groups)
    _runs_like_onnxruntime(model, compiled, (seq, heads, d), tmp_path)


def _runs_like_onnxruntime(model, compiled, dims, tmp_path):
    session = tilefuse.InferenceSession(compiled.plan.save(tmp_path / "attention.tfplan"))
    seed = random.randrange(2**31)
    feeds = _feeds(*dims, np.float32, seed)
    (got,) = session.run(None, feeds)
    (want,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    c = compare_output("y", got, want)
    assert c.ok, f"{dims} seed={seed}: {c.problem}"
