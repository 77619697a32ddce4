"""Attention over sequence lengths without a good divisor (ViT's 197 tokens, a prime; CLIP's
77): partial last tiles instead of 1-row tiles, of powers of two on the GPU and on a host
cut evenly, keys in whole 16-float vectors (197 keys in one tile of 208, not 4 of 64). The
tile interpreter (CPU and CUDA targets, fp32 and fp16 tiles) and the CPU plan agree with
the reference and with onnxruntime on fresh random inputs, mask included."""
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
from tilefuse.reference import evaluate_all
from tilefuse.target import CPU, CUDA_SM90A
from tilefuse.tile_ir.lower import lower_group

from tests.tile_ir.interpreted import interpret


def attention_model(seq: int, heads: int = 2, d: int = 16, dtype: str = "float32", merge: bool = True) -> bytes:
    """softmax(q k^T * scale + mask) v over [1, heads, seq, d], with a key mask [1, 1, 1, seq];
    ``merge``: the heads merged back as a transformer does ([1, seq, heads * d])."""
    elem = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}[dtype]
    io = {n: helper.make_tensor_value_info(n, elem, [1, heads, seq, d]) for n in ("q", "k", "v")}
    io["y"] = helper.make_tensor_value_info("y", elem, [1, seq, heads * d] if merge else [1, heads, seq, d])
    mask = helper.make_tensor_value_info("mask", elem, [1, 1, 1, seq])
    scale = numpy_helper.from_array(np.array(d ** -0.5, dtype), "scale")
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Mul", ["s", "scale"], ["s2"]),
             helper.make_node("Add", ["s2", "mask"], ["s3"]), helper.make_node("Softmax", ["s3"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["o" if merge else "y"])]
    inits = [scale]
    if merge:
        inits.append(numpy_helper.from_array(np.array([1, seq, heads * d], np.int64), "merged"))
        nodes += [helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", ["ot", "merged"], ["y"])]
    graph = helper.make_graph(nodes, "attention", [io["q"], io["k"], io["v"], mask], [io["y"]], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _feeds(seq, heads, d, dtype, seed):
    rng = np.random.default_rng(seed)
    feeds = {n: rng.standard_normal((1, heads, seq, d)).astype(dtype) for n in ("q", "k", "v")}
    mask = np.where(rng.random((1, 1, 1, seq)) < 0.2, -10000.0, 0.0).astype(dtype)
    mask[..., 0] = 0.0  # one key every row may attend to
    feeds["mask"] = mask
    return feeds


@pytest.mark.parametrize("seq, tiles", [(197, "query tiles 50, key tiles 208"), (77, "query tiles 39, key tiles 80")])
@pytest.mark.parametrize("target, dtype", [(CPU, "float32"), (CUDA_SM90A, "float32"), (CUDA_SM90A, "float16")])
@pytest.mark.parametrize("merge", [True, False])
def test_partial_attention_tiles_interpret_like_the_reference(seq, tiles, target, dtype, merge):
    heads, d = 2, 16
    graph = import_onnx(attention_model(seq, heads, d, dtype, merge))
    seed = random.randrange(2**31)
    values = evaluate_all(graph, _feeds(seq, heads, d, dtype, seed))
    (group,) = [g for g in partition_graph(graph, target).groups if str(g.kind) != "opaque"]
    lowered = lower_group(group, target)
    note = lowered.program.notes[0]
    assert note.startswith("flash attention") and "last key tile" in note, note
    if target is CPU:
        assert tiles in note
    for v, got in interpret(lowered, values):
        c = compare_output(v.name, got, values[id(v)])
        assert c.ok, f"seq {seq} {target.name} {dtype} seed={seed}: {c.problem}"


@pytest.mark.parametrize("seq", [197, 77])
def test_partial_attention_tiles_run_on_the_cpu_like_onnxruntime(seq, tmp_path):
    heads, d = 3, 32
    model = attention_model(seq, heads, d)
    compiled = compile_model(model, "cpu")
    session = tilefuse.InferenceSession(compiled.plan.save(tmp_path / "attention.tfplan"))
    seed = random.randrange(2**31)
    feeds = _feeds(seq, heads, d, np.float32, seed)
    (got,) = session.run(None, feeds)
    (want,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    c = compare_output("y", got, want)
    assert c.ok, f"seq {seq} seed={seed}: {c.problem}"


@pytest.mark.parametrize("seq", [17, 37, 50, 150])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gpu_attention_tiles_split_over_the_whole_block(seq, dtype):
    """On the GPU a block's threads split every tile evenly: a tile edge that divides the
    sequence but is no power of two (17, 37, 25 of 50, 50 of 150) left one thread, or a few,
    per block. The tiles are powers of two with a partial last tile instead; the block keeps
    its threads and the kernel still interprets like the reference."""
    heads, d = 2, 16
    graph = import_onnx(attention_model(seq, heads, d, dtype))
    seed = random.randrange(2**31)
    values = evaluate_all(graph, _feeds(seq, heads, d, dtype, seed))
    (group,) = [g for g in partition_graph(graph, CUDA_SM90A).groups if str(g.kind) != "opaque"]
    lowered = lower_group(group, CUDA_SM90A)
    p, s = lowered.program, lowered.program.schedule
    assert all(t & (t - 1) == 0 for t in (s.query_tile, s.key_tile)), s
    assert p.fitted_from == 0 and p.threads >= 64, (p.threads, p.fitted_from)
    for v, got in interpret(lowered, values):
        c = compare_output(v.name, got, values[id(v)])
        assert c.ok, f"seq {seq} {dtype} seed={seed}: {c.problem}"
