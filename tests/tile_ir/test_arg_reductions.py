"""ArgMax and ArgMin run on the row and window schedules, not on one thread.

An ArgMax was its own primitive that only the staged schedule computed: one thread of one
block on the GPU (an LLM's greedy pick over 32,000 logits, a segmentation map's classes),
refused outright where its buffers did not fit on chip (80 x 8,400 detector scores). The
frontend now writes it as two reductions every tiled schedule runs: the extreme, then the
least (``select_last_index``: greatest) position holding it. Checked here on fresh random
inputs full of ties (small integers), for both targets through the tile interpreter and on
the CPU as a compiled plan, against onnxruntime, element for element.
"""
import math

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
from tilefuse.target import CPU, CUDA_SM90A
from tilefuse.tile_ir.lower import lower_group

from tests.tile_ir.interpreted import interpret

ELEM = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "int32": TensorProto.INT32}

# op, input shape, axis, keepdims, select_last_index
CASES = [
    ("ArgMax", (4, 32000), -1, 0, 0),  # greedy decoding over a vocabulary: one row a tile, in chunks
    ("ArgMax", (2, 80, 840), 1, 0, 0),  # detector scores: classes on a middle axis
    ("ArgMax", (1, 19, 40, 40), 1, 0, 0),  # a segmentation map's classes
    ("ArgMin", (3, 7, 5), 2, 1, 1),
    ("ArgMax", (50, 9), 0, 1, 1),
    ("ArgMin", (1000,), 0, 0, 0),
    ("ArgMax", (6, 300), -1, 1, 1),
]


def arg_model(op: str, shape, axis: int, keepdims: int, last: int, dtype: str = "float32") -> bytes:
    out = list(shape)
    if keepdims:
        out[axis] = 1
    else:
        out.pop(axis)
    node = helper.make_node(op, ["x"], ["y"], axis=axis, keepdims=keepdims, select_last_index=last)
    graph = helper.make_graph([node], op.lower(), [helper.make_tensor_value_info("x", ELEM[dtype], shape)],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, out)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


def tied(shape, dtype: str) -> np.ndarray:
    """Fresh random values from a handful of levels, so every row holds ties."""
    return np.random.default_rng().integers(-3, 4, shape).astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16", "int32"])
@pytest.mark.parametrize("op,shape,axis,keepdims,last", CASES)
def test_arg_reductions_are_tiled_and_exact(op, shape, axis, keepdims, last, dtype):
    if dtype != "float32" and math.prod(shape) > 100_000:
        pytest.skip("one dtype is enough for the largest shapes")
    model = arg_model(op, shape, axis, keepdims, last, dtype)
    x = tied(shape, dtype)
    want = ort.InferenceSession(model).run(None, {"x": x})[0]
    graph = import_onnx(onnx.load_from_string(model), {})
    values = evaluate_all(graph, {"x": x})
    np.testing.assert_array_equal(values[id(graph.outputs["y"])], want)  # the reference
    out = math.prod(want.shape)
    for target in (CPU, CUDA_SM90A):
        got = dict(values)
        for g in partition_graph(graph, target).groups:
            lowered = lower_group(g, target)
            program = lowered.program
            if target.device.max_block_threads:  # never one thread of one block on the GPU
                assert patterns.pattern_name(g.match) in ("rows", "windows"), (g.name, g.match)
                assert math.prod(program.grid) * program.threads > 1 or out <= 8, g.name
            for v, result in interpret(lowered, got):
                got[id(v)] = result
        np.testing.assert_array_equal(got[id(graph.outputs["y"])], want, err_msg=target.name)


@pytest.mark.parametrize("op,shape,axis,keepdims,last", [CASES[0], CASES[1], CASES[3]])
def test_arg_reductions_cpu_plan(op, shape, axis, keepdims, last):
    model = arg_model(op, shape, axis, keepdims, last)
    x = tied(shape, "float32")
    want = ort.InferenceSession(model).run(None, {"x": x})[0]
    got = tilefuse.InferenceSession(tilefuse.compile(model, "cpu")).run(None, {"x": x})[0]
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, want)


def test_an_all_nan_row_answers_a_position_inside_the_row():
    """No element equals a row's extreme when the row is all NaN: the position is still
    one of the row's (never the sentinel past its end)."""
    model = arg_model("ArgMax", (3, 17), -1, 0, 0)
    x = np.random.default_rng().standard_normal((3, 17)).astype(np.float32)
    x[1] = np.nan
    got = tilefuse.InferenceSession(tilefuse.compile(model, "cpu")).run(None, {"x": x})[0]
    want = ort.InferenceSession(model).run(None, {"x": x})[0]
    assert 0 <= got[1] < 17
    np.testing.assert_array_equal(got[[0, 2]], want[[0, 2]])
