"""Rows longer than a tile holds (``RowsPolicy.max_row``): one row a tile, walked in chunks.

A mean-subtract over rows of 16,385 ran as one thread of one block on both targets (16,384
got 64 tiles of 256 threads), and so did a softmax or a norm over any longer row. Now the
rows pattern takes rows of any length and the lowering folds them chunk by chunk. The tile
interpreter (CPU and CUDA programs, fp32 and fp16) and the CPU plan agree with the
reference and with onnxruntime on fresh random inputs, at lengths around the chunk edges
and past the limit by one.
"""
import math
import random

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tilefuse
from tilefuse.compare import compare_output
from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.patterns import RowsMatch
from tilefuse.reference import evaluate_all
from tilefuse.target import CPU, CUDA_SM90A
from tilefuse.tile_ir.lower import lower_group

from tests.tile_ir.interpreted import interpret

ELEM = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}


def row_model(kind: str, shape: tuple[int, ...], dtype: str = "float32") -> bytes:
    """``kind`` over the last axis of ``shape``: mean-subtract, softmax, a LayerNorm
    (mean, variance, scale), or a row sum kept as [..., 1]."""
    elem = ELEM[dtype]
    out_shape = (*shape[:-1], 1) if kind == "sum" else shape
    x, y = helper.make_tensor_value_info("x", elem, shape), helper.make_tensor_value_info("y", elem, out_shape)
    inits = []
    if kind == "mean-subtract":
        nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1], keepdims=1), helper.make_node("Sub", ["x", "m"], ["y"])]
    elif kind == "softmax":
        nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=-1)]
    elif kind == "layernorm":
        rng = np.random.default_rng(0)
        inits = [numpy_helper.from_array(rng.standard_normal(shape[-1]).astype(dtype), "g"),
                 numpy_helper.from_array(rng.standard_normal(shape[-1]).astype(dtype), "b")]
        nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1, epsilon=1e-5)]
    elif kind == "sigmoid":  # elementwise: rows of the output shape
        nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["s", "x"], ["y"])]
    else:
        nodes = [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)]
        inits = [numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    graph = helper.make_graph(nodes, kind, [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _feeds(shape, dtype, seed):
    return {"x": np.random.default_rng(seed).standard_normal(shape).astype(dtype)}


CASES = [("mean-subtract", (4, 16385)), ("softmax", (3, 16385)), ("layernorm", (2, 20000)), ("sum", (5, 16384 * 2 + 1)),
         ("mean-subtract", (1, 3, 8192 * 3))]


@pytest.mark.parametrize("target, dtype", [(CPU, "float32"), (CUDA_SM90A, "float32"), (CUDA_SM90A, "float16")],
                         ids=["cpu-fp32", "cuda-fp32", "cuda-fp16"])
@pytest.mark.parametrize("kind, shape", CASES, ids=[f"{k}-{'x'.join(map(str, s))}" for k, s in CASES])
def test_long_rows_are_chunked_and_interpret_like_the_reference(kind, shape, target, dtype):
    graph = import_onnx(row_model(kind, shape, dtype))
    seed = random.randrange(2**31)
    values = evaluate_all(graph, _feeds(shape, dtype, seed))
    groups = [g for g in partition_graph(graph, target).groups if str(g.kind) != "opaque"]
    assert len(groups) == 1 and isinstance(groups[0].match, RowsMatch), [(g.name, g.match) for g in groups]
    lowered = lower_group(groups[0], target)
    p, s = lowered.program, lowered.program.schedule
    # one row a tile, in chunks within the policy's tile, over a block that keeps its threads
    assert s.chunk and s.chunk <= target.rows.tile_elems and s.rows_per_tile == 1, s
    assert math.prod(p.grid) == math.prod(shape[:-1]) and p.threads == target.rows.threads, (p.grid, p.threads)
    assert "chunks of" in p.notes[0], p.notes
    for v, got in interpret(lowered, values):
        c = compare_output(v.name, got, values[id(v)])
        assert c.ok, f"{kind} {shape} {target.name} {dtype} seed={seed}: {c.problem}"


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("kind, shape", [("sigmoid", (84, 8400)), ("softmax", (6, 8400)), ("layernorm", (5, 1000))])
def test_gpu_rows_that_split_unevenly_are_chunked(kind, shape, dtype):
    """Whole rows that a block's threads do not divide (YOLO's 8400 anchors) had thread
    fitting narrow the block to 16 threads of 525 unrolled elements each (a 1.2 MB cubin);
    on the GPU such a row is a tile of chunks of whole blocks. The CPU keeps whole rows."""
    graph = import_onnx(row_model(kind, shape, dtype))
    seed = random.randrange(2**31)
    values = evaluate_all(graph, _feeds(shape, dtype, seed))
    for target in (CUDA_SM90A, CPU):
        (group,) = [g for g in partition_graph(graph, target).groups if str(g.kind) != "opaque"]
        lowered = lower_group(group, target)
        p, s = lowered.program, lowered.program.schedule
        if target is CPU:
            assert s.chunk == 0, s
            continue
        assert s.chunk % p.threads == 0 and p.threads == target.rows.threads and not p.fitted_from, (s, p.threads)
        for v, got in interpret(lowered, values):
            c = compare_output(v.name, got, values[id(v)])
            assert c.ok, f"{kind} {shape} {dtype} seed={seed}: {c.problem}"


@pytest.mark.parametrize("shape", [(2560, 160), (200, 80), (96, 40)])
def test_gpu_row_tiles_of_short_rows_keep_their_block(shape):
    """Short rows (YOLO's 10 rows of 160 a tile, 64 threads after fitting): the row count
    of a tile is chosen so that the block's threads divide it, not narrowed to fit it."""
    graph = import_onnx(row_model("sigmoid", shape))
    seed = random.randrange(2**31)
    values = evaluate_all(graph, _feeds(shape, "float32", seed))
    (group,) = [g for g in partition_graph(graph, CUDA_SM90A).groups if str(g.kind) != "opaque"]
    lowered = lower_group(group, CUDA_SM90A)
    p = lowered.program
    assert p.threads == CUDA_SM90A.rows.threads and not p.fitted_from, (p.threads, p.notes)
    for v, got in interpret(lowered, values):
        c = compare_output(v.name, got, values[id(v)])
        assert c.ok, f"{shape} seed={seed}: {c.problem}"


def test_rows_that_fit_are_not_chunked():
    graph = import_onnx(row_model("mean-subtract", (4, 16384)))
    (group,) = [g for g in partition_graph(graph, CUDA_SM90A).groups if str(g.kind) != "opaque"]
    assert lower_group(group, CUDA_SM90A).program.schedule.chunk == 0


@pytest.mark.parametrize("kind, shape", [("softmax", (2, 16385)), ("layernorm", (3, 17000)), ("sum", (2, 40000))])
def test_long_rows_run_on_the_cpu_like_onnxruntime(kind, shape, tmp_path):
    model = row_model(kind, shape)
    session = tilefuse.InferenceSession(tilefuse.compile(model, "cpu").save(tmp_path / f"{kind}.tfplan"))
    seed = random.randrange(2**31)
    feeds = _feeds(shape, np.float32, seed)
    (got,) = session.run(None, feeds)
    (want,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    c = compare_output("y", got, want)
    assert c.ok, f"{kind} {shape} seed={seed}: {c.problem}"
