"""Products by a 2-D weight over tokens with batch dims ([1, 56, 56, 96] in ConvNeXt, [2, 16,
H] in a small transformer) whose per-batch rows do not make whole row tiles: on the GPU the
batch is folded into the rows, one product of [prod(batch) * M, K]. ConvNeXt's MLP chain ran
14-row tiles of 64 threads (a 1.1 MB cubin). The tile interpreter matches the reference."""
import random

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tilefuse.compare import compare_output
from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.reference import evaluate_all
from tilefuse.target import CPU, CUDA_SM90A
from tilefuse.tile_ir.lower import lower_group

from tests.tile_ir.interpreted import interpret


def mlp(shape: tuple[int, ...], hidden: int) -> bytes:
    c = shape[-1]
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((c, hidden)) * c ** -0.5).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((hidden, c)) * hidden ** -0.5).astype(np.float32), "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model.SerializeToString()


@pytest.mark.parametrize("shape, hidden", [((1, 56, 56, 96), 384), ((3, 7, 7, 32), 128), ((8, 197, 64), 128)])
def test_gpu_products_fold_their_batch_into_rows(shape, hidden):
    """(8, 197, 64): one batch dim whose rows, a prime, have no divisor tile (ViT at batch
    32: tiles of one row, then no schedule at all for its MLP chain)."""
    graph = import_onnx(mlp(shape, hidden))
    seed = random.randrange(2**31)
    values = evaluate_all(graph, {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)})
    groups = [g for g in partition_graph(graph, CUDA_SM90A).groups if str(g.kind) != "opaque"]
    for g in groups:
        lowered = lower_group(g, CUDA_SM90A)
        s = lowered.program.schedule
        assert s.batch == () and s.m == np.prod(shape[:-1]), s
        assert not any("fell through" in n for n in lowered.program.notes), lowered.program.notes
        for v, got in interpret(lowered, values):
            c = compare_output(v.name, got, values[id(v)])
            assert c.ok, f"{shape} seed={seed}: {c.problem}"
    # the CPU keeps its batch grid
    (g, *_) = [g for g in partition_graph(graph, CPU).groups if str(g.kind) != "opaque"]
    assert lower_group(g, CPU).program.schedule.batch == shape[:-2]


def test_a_single_batch_dim_whose_rows_make_tiles_keeps_its_batch_grid():
    """2 x 16 tokens: 16 rows a batch index make whole tiles; folding them lost the operand
    tiles' bulk copies (the batch stays a grid axis)."""
    graph = import_onnx(mlp((2, 16, 64), 256))
    (g, *_) = [g for g in partition_graph(graph, CUDA_SM90A).groups if str(g.kind) != "opaque"]
    assert lower_group(g, CUDA_SM90A).program.schedule.batch == (2,)
