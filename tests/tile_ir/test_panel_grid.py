"""A host convolution by packed panels picks its column tiles for the grid they make
(``panels.column_tile``): where the nearest tile of whole panels would leave a partial
last tile or give one core more tiles than another, the width whose busiest core and
whole work cost least. MobileNetV2's 960 -> 320 over 7 x 7 took 5 tiles of 64 (3 on one
core of two), now 2 of 160; its 960 -> 160 took 2 tiles of 96 (192 columns), now 96 and
a last one that computes only its 2 panels (``PanelGemm.columns``). Lowered programs
interpret like the reference; compiled plans match onnxruntime and the reference on
fresh random inputs, the partial tile's columns included."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.tile_ir.compiled import cpu_plan_matches
from tests.tile_ir.interpreted import interpret
from tilefuse.compare import compare_output
from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.reference import evaluate_all
from tilefuse.target import CPU
from tilefuse.tile_ir.ir import PanelGemm, statements
from tilefuse.tile_ir.lower import lower_group
from tilefuse.tile_ir.lower.panels import _grid_cost

# name: (x shape, output channels, column tile, whether the last tile is partial)
CASES = {
    "960_to_160": ((1, 960, 7, 7), 160, 96, True),
    "960_to_320": ((1, 960, 7, 7), 320, 160, False),
    "576_to_160": ((1, 576, 7, 7), 160, 96, True),
    "batch_2": ((2, 96, 7, 7), 160, 96, True),
    "three_row_tiles": ((3, 64, 7, 7), 96, 64, True),  # a tile an image: 3 x (64, 32) on 2 cores
    "last_tile_whole_panels": ((2, 96, 7, 7), 100, 64, False),  # 36 columns past 64: the last tile's 2 panels
    "balanced_kept": ((1, 320, 7, 7), 1280, 128, False),  # 10 tiles of 128: 5 a core, as before
}


def _model(x_shape, cout, rng) -> onnx.ModelProto:
    w = (rng.standard_normal((cout, x_shape[1], 1, 1)) / np.sqrt(x_shape[1])).astype(np.float32)
    shift = rng.standard_normal(cout).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[1, 1]),
             helper.make_node("Clip", ["c", "lo", "hi"], ["y"])]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(shift, "b"),
             numpy_helper.from_array(np.array(0, np.float32), "lo"), numpy_helper.from_array(np.array(6, np.float32), "hi")]
    graph = helper.make_graph(nodes, "pointwise", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [x_shape[0], cout, *x_shape[2:]])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("name", list(CASES))
def test_column_tiles_balance_the_grid(name):
    x_shape, cout, tile, partial = CASES[name]
    rng = np.random.default_rng()
    model = _model(x_shape, cout, rng)
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32)}
    graph = import_onnx(model)
    (group,) = [g for g in partition_graph(graph, CPU).groups if str(g.kind) != "opaque"]
    low = lower_group(group, CPU)
    products = [s for s in statements(low.program.body) if isinstance(s, PanelGemm)]
    assert products and low.program.schedule.tile_n == tile, low.program.notes
    assert all((p.columns is not None) == partial for p in products), [str(p.columns) for p in products]
    values = evaluate_all(graph, feeds)
    for v, got in interpret(low, values):
        c = compare_output(v.name, got, values[id(v)])
        assert c.ok, f"{name} interpreted: {c.problem}"
    cpu_plan_matches(name, model, graph, feeds)


def test_the_grid_cost_weighs_the_busiest_core_and_the_whole():
    # 320 columns on 2 cores: 5 tiles of 64 put 3 on one core; 2 of 160 one each
    assert _grid_cost(320, 32, 160, 1, 2, 4) < _grid_cost(320, 32, 64, 1, 2, 4)
    # 160 columns: a last tile of 64 (2 panels) where tiles of 96 rounded up computed 192
    assert _grid_cost(160, 32, 96, 1, 2, 0) == 2 * 96 + (96 + 64)
    # one core: the whole work, each tile's own cost included
    assert _grid_cost(160, 32, 32, 1, 1, 4) == 2 * 5 * 36
    # rows of tiles (lead) share the static schedule's runs: 3 x 2 tiles on 4 cores
    assert _grid_cost(64, 32, 32, 3, 4, 0) == 4 * 64 + 6 * 32
