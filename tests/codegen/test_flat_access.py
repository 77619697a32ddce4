"""The C printer addresses an access at its flat offset where the per-dim indices divide the
innermost loop's variable and linearising cancels that (codegen/cpu/flat_access.py): a
channels-as-rows convolution's epilogue runs along a channel's whole plane, its stores
and its residual's loads plain runs, no division per element. A positions-as-rows
convolution's epilogue reads its tile turned into the store's order (GemmPolicy.
turned_epilogue): its stores are runs too. Where it reads the tile transposed (that
policy off), the store keeps its per-dim indices: made a run, GCC would vectorise it with
gathers. The compiled plans match onnxruntime and the reference on fresh random inputs."""
from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tilefuse.codegen.cpu.emit import emit_program
from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.target import CPU, Target, adjust
from tilefuse.tile_ir.lower import lower_group

from tests.tile_ir.compiled import cpu_plan_matches


def _conv_residual(channels: int, size: int, k: int, rng) -> onnx.ModelProto:
    """y = relu(conv(x) + b) + x, NCHW [1, channels, size, size]."""
    w = (rng.standard_normal((channels, channels, k, k)) / np.sqrt(channels * k * k)).astype(np.float32)
    b = rng.standard_normal(channels).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], pads=[k // 2] * 4),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Add", ["r", "x"], ["y"])]
    shape = [1, channels, size, size]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _stores_to_out(name: str, model: onnx.ModelProto, target: Target = CPU) -> tuple[list[str], bool]:
    graph = import_onnx(model)
    (g,) = [g for g in partition_graph(graph, target).groups if str(g.kind) != "opaque"]
    program = lower_group(g, target).program
    text = emit_program(program).text
    body = text[text.index("(void **args)\n{"):]
    return re.findall(r"out0\[(.*?)\] = ", body), program.schedule.channel_rows


@pytest.mark.parametrize("size,k", [(14, 1), (28, 3), (9, 3)])
def test_a_channel_rows_epilogue_stores_and_reads_runs(size, k):
    rng = np.random.default_rng()
    model = _conv_residual(32, size, k, rng)
    stores, channel_rows = _stores_to_out("conv", model)
    assert channel_rows and stores
    for index in stores:
        assert "/" not in index and "%" not in index, index
    cpu_plan_matches(f"conv{k}x{k}_{size}", model, import_onnx(model),
                     {"x": rng.standard_normal((1, 32, size, size)).astype(np.float32)})


def test_a_store_from_a_turned_tile_is_a_run_and_from_a_transposed_one_keeps_its_dims():
    rng = np.random.default_rng()
    model = _conv_residual(64, 7, 1, rng)  # 7 x 7: positions as rows
    stores, channel_rows = _stores_to_out("conv", model)
    assert not channel_rows and stores
    assert not any(re.search(r"\* 7\b", index) for index in stores), stores  # the turned tile: one run
    transposed = adjust(CPU, gemm__turned_epilogue=False)  # the tile read transposed
    stores, channel_rows = _stores_to_out("conv", model, transposed)
    assert not channel_rows and stores
    assert all(re.search(r"\* 7\b", index) for index in stores), stores  # its row's term: per-dim indices
    feeds = {"x": rng.standard_normal((1, 64, 7, 7)).astype(np.float32)}
    for target in (CPU, transposed):
        cpu_plan_matches("conv7x7", model, import_onnx(model), feeds, target=target)
