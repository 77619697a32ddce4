"""A product with a whole-row epilogue (projection + residual + LayerNorm) over a row count
with no power-of-two divisor: on the GPU, power-of-two row tiles with a partial last one
(its rows clamped, the reductions too), not tiles of the largest divisor (Whisper's 1500
frames: 15-row tiles of 64 threads whose FMA loops unrolled into a 2.9 MB cubin). The tile
interpreter matches the reference on fresh random inputs, fp32 and fp16."""
import random

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tilefuse.compare import compare_output
from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.patterns import GemmMatch
from tilefuse.reference import evaluate_all
from tilefuse.target import CUDA_SM90A
from tilefuse.tile_ir.lower import lower_group

from tests.tile_ir.interpreted import interpret


def proj_norm(rows: int, hidden: int, dtype: str) -> bytes:
    elem = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}[dtype]
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((hidden, hidden)) * hidden ** -0.5).astype(dtype), "w"),
             numpy_helper.from_array(rng.standard_normal(hidden).astype(dtype), "b"),
             numpy_helper.from_array(rng.standard_normal(hidden).astype(dtype), "g"),
             numpy_helper.from_array(rng.standard_normal(hidden).astype(dtype), "beta")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["pb"]),
             helper.make_node("Add", ["pb", "r"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "g", "beta"], ["y"], axis=-1, epsilon=1e-5)]
    io = [helper.make_tensor_value_info(n, elem, [1, rows, hidden]) for n in ("x", "r")]
    graph = helper.make_graph(nodes, "proj_norm", io, [helper.make_tensor_value_info("y", elem, [1, rows, hidden])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("rows", [150, 97, 1500])
def test_whole_row_tiles_are_powers_of_two_with_a_partial_last_one(rows, dtype):
    hidden = 64
    graph = import_onnx(proj_norm(rows, hidden, dtype))
    seed = random.randrange(2**31)
    rng = np.random.default_rng(seed)
    values = evaluate_all(graph, {n: rng.standard_normal((1, rows, hidden)).astype(dtype) for n in ("x", "r")})
    (group,) = [g for g in partition_graph(graph, CUDA_SM90A).groups if str(g.kind) != "opaque"]
    assert isinstance(group.match, GemmMatch) and group.match.epilogue.reductions, group.match
    lowered = lower_group(group, CUDA_SM90A)
    s = lowered.program.schedule
    assert s.whole_rows and s.tile_m & (s.tile_m - 1) == 0 and rows % s.tile_m, s
    assert "last row tile" in lowered.program.notes[0], lowered.program.notes
    for v, got in interpret(lowered, values):
        c = compare_output(v.name, got, values[id(v)])
        assert c.ok, f"rows {rows} {dtype} seed={seed}: {c.problem}"
