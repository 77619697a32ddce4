"""Long reductions to fewer outputs than cores are split in two (partition/split_reductions.py):
a whole-tensor sum was one thread of one block on the GPU (65,536 terms), a per-channel
sum over N, H, W three threads, a row of 4M one block. Each case: the split graph is
parallel on the GPU (every group's tiles cover the cores, but for the last small stage),
every GPU program interprets like the reference, and the CPU plan matches onnxruntime
and the reference on fresh random inputs."""
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
from tilefuse.reference import evaluate_all, run_graph
from tilefuse.target import CPU, CUDA_SM90A, adjust
from tilefuse.tile_ir.lower import lower_group

from tests.tile_ir.interpreted import interpret

ELEM = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "int64": TensorProto.INT64}


def reduce_model(shape, axes, op="ReduceSum", dtype="float32", keepdims=1, then_sub=False) -> bytes:
    x = helper.make_tensor_value_info("x", ELEM[dtype], list(shape))
    y = helper.make_tensor_value_info("y", ELEM[dtype], None)
    inits = [numpy_helper.from_array(np.array(axes, np.int64), "axes")]
    nodes = [helper.make_node(op, ["x", "axes"], ["r" if then_sub else "y"], keepdims=keepdims)]
    if then_sub:
        nodes.append(helper.make_node("Sub", ["x", "r"], ["y"]))
    graph = helper.make_graph(nodes, "reduce", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model)
    onnx.checker.check_model(model)
    return model.SerializeToString()


def _input(shape, dtype, op, seed):
    rng = np.random.default_rng(seed)
    if dtype == "int64":
        return rng.integers(-1000, 1000, shape).astype(np.int64)
    if op == "ReduceProd":  # products of many terms near 1, no overflow
        return (1 + 1e-4 * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


CASES = [  # shape, axes, op, dtype, keepdims, then_sub
    ((64, 1024), [0, 1], "ReduceSum", "float32", 1, False),  # a whole-tensor sum
    ((64, 1024), [0, 1], "ReduceMean", "float32", 0, False),
    ((8, 3, 224, 224), [0, 2, 3], "ReduceSum", "float32", 1, False),  # per channel over N, H, W
    ((2, 4, 512, 256), [0, 2, 3], "ReduceMax", "float32", 0, False),
    ((1, 1 << 20), [1], "ReduceSum", "float16", 1, False),  # one long row, half floats
    ((4, 1 << 18), [1], "ReduceMean", "float32", 1, True),  # x - mean(x) over 4 rows
    ((1 << 16, 4), [0], "ReduceMin", "float32", 1, False),  # no reduced axis last
    ((256, 512), [0, 1], "ReduceSum", "int64", 0, False),
    ((32, 512), [0, 1], "ReduceProd", "float32", 1, False),
]


def _rounding(x, axes, op):
    """What a float32 sum or mean of these terms may be off by, in any order of summing:
    twice float32's epsilon times sqrt(terms) times the terms' L2 norm, the largest over the
    outputs. A whole-tensor sum of 65,536 normals lands near 0 as often as near 256, so the
    default bound (a share of the result's size) cannot hold for the rounding of two
    different orders (onnxruntime's and the plan's); a term dropped or counted twice still
    exceeds this one. None where the default holds (exact or non-summing reductions, and
    half floats, whose output rounding dominates)."""
    if op not in ("ReduceSum", "ReduceMean") or x.dtype != np.float32:
        return None
    terms = int(np.prod([x.shape[a] for a in axes]))
    norm = float(np.sqrt(np.square(x.astype(np.float64)).sum(axis=tuple(axes))).max())
    bound = 2 * float(np.finfo(np.float32).eps) * np.sqrt(terms) * norm
    return bound / terms if op == "ReduceMean" else bound


def _close(name, got, want, atol):
    """compare_output's default rule, or every element within atol + 1e-4 x |want|."""
    return compare_output(name, got, want) if atol is None else compare_output(name, got, want, rtol=1e-4, atol=atol)


def _ids(case):
    shape, axes, op, dtype, keepdims, sub = case
    return f"{op}-{'x'.join(map(str, shape))}-{''.join(map(str, axes))}-{dtype}-k{keepdims}{'-sub' if sub else ''}"


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_split_reductions_are_parallel_on_the_gpu_and_interpret_like_the_reference(case):
    shape, axes, op, dtype, keepdims, sub = case
    graph = import_onnx(reduce_model(shape, axes, op, dtype, keepdims, sub))
    seed = random.randrange(2**31)
    feeds = {"x": _input(shape, dtype, op, seed)}
    partition = partition_graph(graph, CUDA_SM90A)
    values = evaluate_all(graph, feeds)  # the split graph's values, each checked below
    reductions = [g for g in partition.groups if any(n.op.kind.name == "REDUCE" for n in g.nodes)]
    assert len(reductions) >= 2, [[n.op.name for n in g.nodes] for g in partition.groups]
    first = lower_group(reductions[0], CUDA_SM90A).program
    whole = import_onnx(reduce_model(shape, axes, op, dtype, keepdims, sub))
    unsplit = adjust(CUDA_SM90A, rows__split_part=0)
    (before,) = [lower_group(g, unsplit).program for g in partition_graph(whole, unsplit).groups
                 if any(n.op.kind.name == "REDUCE" for n in g.nodes)]
    lanes = lambda p: int(np.prod(p.grid)) * p.threads  # noqa: E731
    assert lanes(first) >= 8 * lanes(before), (first.notes, before.notes)
    for group in partition.groups:
        if str(group.kind) == "opaque":
            continue
        for v, got in interpret(lower_group(group, CUDA_SM90A), values):
            c = compare_output(v.name, got, values[id(v)])
            assert c.ok, f"{_ids(case)} seed={seed}: {c.problem}"
    (want,) = ort.InferenceSession(reduce_model(shape, axes, op, dtype, keepdims, sub),
                                   providers=["CPUExecutionProvider"]).run(None, feeds)
    (y,) = graph.outputs.values()
    c = _close("y", values[id(y)], want, _rounding(feeds["x"], axes, op))
    assert c.ok, f"the split graph's reference against onnxruntime, seed={seed}: {c.problem}"


@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_split_reductions_run_on_the_cpu_like_onnxruntime_and_the_reference(case, tmp_path):
    shape, axes, op, dtype, keepdims, sub = case
    model = reduce_model(shape, axes, op, dtype, keepdims, sub)
    # a CPU of many cores, so that the split happens on this one too
    target = adjust(CPU, device__cores=64, rows__split_part=4096, rows__split_row=1 << 18)
    compiled = compile_model(model, target)
    assert sum(n.op.kind.name == "REDUCE" for g in compiled.partition.groups for n in g.nodes) >= 2
    session = tilefuse.InferenceSession(compiled.plan.save(tmp_path / "reduce.tfplan"))
    seed = random.randrange(2**31)
    feeds = {"x": _input(shape, dtype, op, seed)}
    (got,) = session.run(None, feeds)
    (want,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    (ref,) = run_graph(import_onnx(model), feeds).values()
    atol = _rounding(feeds["x"], axes, op)
    for against, name in ((want, "onnxruntime"), (ref, "reference")):
        c = _close("y", got, against, atol)
        assert c.ok, f"{_ids(case)} against {name}, seed={seed}: {c.problem}"


def test_reductions_with_enough_outputs_or_few_terms_are_left_whole():
    # enough outputs (a leading-axis reduction to RowsPolicy.split_window_outputs of them:
    # test_split_windows.py splits fewer); a rows reduction a block reads quickly (a norm
    # over 2 rows of 20,000, which the rows kernel fuses with its normalisation); a small
    # whole-tensor sum
    for shape, axes in [((512, 1 << 15), [0]), ((256, 768), [1]), ((2, 20000), [1]), ((64, 64), [0, 1])]:
        graph = import_onnx(reduce_model(shape, axes))
        partition_graph(graph, CUDA_SM90A)
        assert sum(n.op.kind.name == "REDUCE" for n in graph.nodes) == 1, (shape, axes)


def test_a_length_with_no_divisor_is_left_whole():
    graph = import_onnx(reduce_model((1, 65537), [1]))  # 65,537 is prime
    partition_graph(graph, CUDA_SM90A)
    assert sum(n.op.kind.name == "REDUCE" for n in graph.nodes) == 1
