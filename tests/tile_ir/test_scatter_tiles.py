"""Scatters on the GPU: blocks that own output tiles apply the updates landing in them.

A lone ScatterND of 16 rows into a 2,048 x 256 KV cache was refused on sm_90a ("the staged
schedule needs 2048 KB of on-chip tile buffers"), and a scatter small enough to fit ran on
one thread of one block. The scatter pattern tiles the output over a grid instead. Checked
here through the tile interpreter on the programs lowered for sm_90a, against onnxruntime
on fresh random inputs: KV-cache writes, whole index tuples, negative indices, repeated
indices with every reduction (applied in order, as onnxruntime does), indices shorter
than the data on other axes, fp16 data; the same models as CPU plans; and a few kernels
through TileLang and nvcc for sm_90a.
"""
import math
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import tilefuse
from tilefuse import patterns
from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.reference import evaluate_all
from tilefuse.target import CUDA_SM90A, adjust
from tilefuse.tile_ir.lower import lower_group

from tests.tile_ir.interpreted import interpret

ELEM = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "int64": TensorProto.INT64}


def scatter_model(op: str, data, ind, upd, dtype="float32", **attrs) -> bytes:
    node = helper.make_node(op, ["data", "ind", "upd"], ["y"], **attrs)
    graph = helper.make_graph([node], op.lower(), [
        helper.make_tensor_value_info("data", ELEM[dtype], data),
        helper.make_tensor_value_info("ind", TensorProto.INT64, ind),
        helper.make_tensor_value_info("upd", ELEM[dtype], upd)],
        [helper.make_tensor_value_info("y", ELEM[dtype], data)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def nd_indices(rng, lead, count, unique, negative=False):
    """``count`` index tuples into ``lead`` (distinct where ``unique``), some negative."""
    flat = rng.choice(math.prod(lead), count, replace=not unique)
    tuples = np.stack(np.unravel_index(flat, lead), -1).astype(np.int64)
    if negative:
        tuples = np.where(rng.random(tuples.shape) < 0.5, tuples - np.array(lead), tuples)
    return tuples


# name: (op, data shape, index tuples' leading shape, tuple depth, attrs, unique)
ND = {
    "kv-cache-rows": ((2048, 256), (16,), 1, {}, True),
    "kv-cache-4d": ((2, 4, 64, 32), (2, 4, 5), 3, {}, True),
    "elements-negative": ((30, 40), (100,), 2, {}, True),
    "add-repeats": ((30, 40), (300,), 2, {"reduction": "add"}, False),
    "mul-repeats": ((12, 7, 9), (40,), 1, {"reduction": "mul"}, False),
    "max-repeats": ((64, 50), (90,), 1, {"reduction": "max"}, False),
    "min-repeats": ((5, 6, 7), (25, 2), 2, {"reduction": "min"}, False),
}


def nd_case(name, dtype, rng):
    shape, count, depth, attrs, unique = ND[name]
    tuples = nd_indices(rng, shape[:depth], math.prod(count), unique, negative=name == "elements-negative")
    ind = tuples.reshape(*count, depth)
    upd_shape = (*count, *shape[depth:])
    low, high = (0.5, 1.5) if name == "mul-repeats" else (-2, 2)
    feeds = {"data": rng.uniform(low, high, shape).astype(dtype), "ind": ind,
             "upd": rng.uniform(low, high, upd_shape).astype(dtype)}
    return scatter_model("ScatterND", shape, ind.shape, upd_shape, dtype, **attrs), feeds


# name: (data shape, indices shape, axis, attrs)
ELEMENTS = {
    "rows-axis1": ((64, 1024), (64, 8), 1, {}),
    "axis0-shorter": ((10, 20), (3, 15), 0, {}),
    "add-repeats-3d": ((4, 30, 6), (3, 50, 5), 1, {"reduction": "add"}),
    "max-negative": ((8, 33), (8, 40), -1, {"reduction": "max"}),
}


def elements_case(name, dtype, rng):
    shape, ishape, axis, attrs = ELEMENTS[name]
    n = shape[axis]
    if attrs:  # repeats allowed (and negative indices for one)
        ind = rng.integers(-n if name == "max-negative" else 0, n, ishape)
    else:  # distinct along the axis for each position of the others
        ind = np.argsort(rng.random(ishape[:axis % len(shape)] + (n,) + ishape[axis % len(shape) + 1:]),
                         axis=axis)
        ind = ind[tuple(slice(0, d) for d in ishape)]
    feeds = {"data": rng.uniform(-2, 2, shape).astype(dtype), "ind": ind.astype(np.int64),
             "upd": rng.uniform(-2, 2, ishape).astype(dtype)}
    return scatter_model("ScatterElements", shape, ishape, ishape, dtype, axis=axis, **attrs), feeds


CASES = [("nd", n) for n in ND] + [("elements", n) for n in ELEMENTS]


def build(form, name, dtype):
    rng = np.random.default_rng()
    return (nd_case if form == "nd" else elements_case)(name, dtype, rng)


def check(got, want, dtype, reduction):
    if reduction and dtype == "float16":
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-2, atol=2e-2)
    elif reduction:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(got, want)


def onnxruntime_answer(form, name, model, feeds, dtype, reduction):
    """onnxruntime's output; its CPU provider has no float16 scatter reductions, so those
    are its float32 answer on the same (float16) values."""
    if not (reduction and dtype == "float16"):
        return ort.InferenceSession(model).run(None, feeds)[0]
    wide = {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in feeds.items()}
    shapes = [feeds[k].shape for k in ("data", "ind", "upd")]
    attrs = {"reduction": reduction} if form == "nd" else {"axis": ELEMENTS[name][2], "reduction": reduction}
    model32 = scatter_model("ScatterND" if form == "nd" else "ScatterElements", *shapes, "float32", **attrs)
    return ort.InferenceSession(model32).run(None, wide)[0].astype(np.float16)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("form,name", CASES)
def test_gpu_scatter_tiles_match_onnxruntime(form, name, dtype):
    model, feeds = build(form, name, dtype)
    reduction = (ND[name][3] if form == "nd" else ELEMENTS[name][3]).get("reduction")
    want = onnxruntime_answer(form, name, model, feeds, dtype, reduction)
    graph = import_onnx(onnx.load_from_string(model), {})
    values = evaluate_all(graph, feeds)
    (group,) = [g for g in partition_graph(graph, CUDA_SM90A).groups]
    assert isinstance(group.match, patterns.ScatterMatch), group.match
    lowered = lower_group(group, CUDA_SM90A)
    program = lowered.program
    assert program.schedule.family == "scatter"
    # never one thread of one block; a grid of many where the output has many tiles' worth
    assert program.threads > 1, (program.grid, program.threads)
    out = math.prod(want.shape)
    assert math.prod(program.grid) >= min(CUDA_SM90A.device.cores, out // 4096), program.grid
    ((_, got),) = interpret(lowered, values)
    check(got, want, dtype, reduction)


@pytest.mark.parametrize("form,name", [("nd", "kv-cache-rows"), ("nd", "add-repeats"), ("elements", "add-repeats-3d")])
def test_cpu_plans_of_the_same_scatters(form, name):
    model, feeds = build(form, name, "float32")
    want = ort.InferenceSession(model).run(None, feeds)[0]
    got = tilefuse.InferenceSession(tilefuse.compile(model, "cpu")).run(None, feeds)[0]
    check(got, want, "float32", name != "kv-cache-rows")


def test_an_index_out_of_range_is_reported_not_written():
    model, feeds = build("nd", "kv-cache-rows", "float32")
    feeds["ind"][3, 0] = 2048
    graph = import_onnx(onnx.load_from_string(model), {})
    (group,) = partition_graph(graph, CUDA_SM90A).groups
    lowered = lower_group(group, CUDA_SM90A)
    from tilefuse.tile_ir.interpret import run_program

    out = np.zeros((2048, 256), np.float32)
    status = np.zeros(2, np.int64)
    run_program(lowered.program, [feeds["data"], feeds["ind"], feeds["upd"], out], status)
    assert status[1] == 2048  # the bad value, claimed by the check (the runtime names the node)


@pytest.mark.parametrize("form,name", [("nd", "kv-cache-rows"), ("nd", "min-repeats"), ("elements", "axis0-shorter")])
def test_scatter_kernels_compile_for_sm90a(form, name):
    pytest.importorskip("tilelang")
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    from tilefuse.codegen.cuda import build_all

    model, _ = build(form, name, "float16")
    graph = import_onnx(onnx.load_from_string(model), {})
    (group,) = partition_graph(graph, CUDA_SM90A).groups
    program = lower_group(group, CUDA_SM90A).program
    (art,) = build_all([program], arch="sm_90a")
    assert art.path.read_bytes()[:4] == b"\x7fELF"
    assert art.launch.block[0] == program.threads and tuple(art.launch.grid[:len(program.grid)]) == program.grid


@pytest.mark.parametrize("name", list(ELEMENTS))
def test_scatter_elements_one_thread_a_row(name):
    """Past ``ScatterPolicy.max_row_compares`` (long rows, many steps) each row's thread
    writes its updates where they land instead: the same answers."""
    target = adjust(CUDA_SM90A, scatter__max_row_compares=0)
    model, feeds = build("elements", name, "float32")
    want = ort.InferenceSession(model).run(None, feeds)[0]
    graph = import_onnx(onnx.load_from_string(model), {})
    (group,) = partition_graph(graph, target).groups
    lowered = lower_group(group, target)
    assert lowered.program.schedule.per_element is False
    ((_, got),) = interpret(lowered, evaluate_all(graph, feeds))
    check(got, want, "float32", ELEMENTS[name][3].get("reduction"))
