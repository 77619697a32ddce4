"""On the CPU a float32 convolution with positions as rows (maps too small for channels as
rows: 7 x 7, odd sizes) reads its weight from panels packed at compile time
(tile_ir/lower/panels.py) instead of a weight tile copied for every output tile: the
im2col tile, filled per K step as before, goes through the host's panel core. At 1 x 1
and 3 x 3, strided and padded, with column tails (channels past the last panel) and K
steps of part of the input channels, the lowered program interprets like the reference
and the compiled plan matches onnxruntime and the reference on fresh random inputs. A
pointwise one's im2col tile (unit strides, no padding) is its input's planes turned over by
the host's block transpose.
Depthwise, grouped and channels-as-rows convolutions and the GPU keep their tiles."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tilefuse.compare import compare_output
from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.reference import evaluate_all
from tilefuse.target import CPU, CUDA_SM90A
from tilefuse.tile_ir.ir import PanelGemm, Transpose, statements
from tilefuse.tile_ir.lower import lower_group

from tests.tile_ir.compiled import cpu_plan_matches
from tests.tile_ir.interpreted import interpret

CASES = {
    # name: (x shape [N, C, H, W], Cout, kernel, stride, pads, group)
    "pointwise_7x7_192_to_1152": ((1, 192, 7, 7), 1152, 1, 1, 0, 1),
    "pointwise_7x7_column_tail": ((1, 96, 7, 7), 200, 1, 1, 0, 1),
    "k3_7x7_padded": ((1, 64, 7, 7), 96, 3, 1, 1, 1),
    "k3_stride2_odd_map": ((2, 24, 15, 13), 40, 3, 2, 1, 1),
    "k3_many_channels_k_steps": ((1, 512, 7, 7), 64, 3, 1, 1, 1),
    "grouped_keeps_tiles": ((1, 32, 7, 7), 64, 3, 1, 1, 2),
    "pointwise_7x7_batch_2": ((2, 96, 7, 7), 64, 1, 1, 0, 1),
    "pointwise_odd_map_k_steps": ((1, 768, 5, 9), 40, 1, 1, 0, 1),
    "pointwise_strided": ((1, 64, 14, 14), 96, 1, 2, 0, 1),
}
# pointwise, unit strides, no padding, whole channel steps: the im2col tile is the input's
# planes turned over, filled by the host's block transpose (conv_tiles.turned_input)
TURNED = {"pointwise_7x7_192_to_1152", "pointwise_7x7_column_tail", "pointwise_7x7_batch_2", "pointwise_odd_map_k_steps"}


def _model(x_shape, cout, k, stride, pad, group, rng) -> onnx.ModelProto:
    cin = x_shape[1]
    w = (rng.standard_normal((cout, cin // group, k, k)) / np.sqrt(cin * k * k / group)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], strides=[stride, stride],
                              pads=[pad] * 4, group=group),
             helper.make_node("Relu", ["c"], ["y"])]
    out = (x_shape[2] + 2 * pad - k) // stride + 1, (x_shape[3] + 2 * pad - k) // stride + 1
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [x_shape[0], cout, *out])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("name", list(CASES))
def test_a_host_convolution_reads_its_weight_from_panels(name):
    x_shape, cout, k, stride, pad, group = CASES[name]
    rng = np.random.default_rng()
    model = _model(x_shape, cout, k, stride, pad, group, rng)
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32)}
    graph = import_onnx(model)
    values = evaluate_all(graph, feeds)
    for target in (CPU, CUDA_SM90A):
        (g,) = [g for g in partition_graph(graph, target).groups if str(g.kind) != "opaque"]
        low = lower_group(g, target)
        panels = [s for s in statements(low.program.body) if isinstance(s, PanelGemm)]
        schedule = low.program.schedule
        assert not schedule.channel_rows, (target.name, low.program.notes)  # positions as rows: the case under test
        want_panels = target is CPU and group == 1
        assert bool(panels) == want_panels and (schedule.panel_width == 32) == want_panels, (target.name, low.program.notes)
        if want_panels:  # the weight is not copied into a tile: only the im2col tile is on chip
            assert [b.name for b in low.program.allocs if b.name.startswith(("a_tile", "b_tile"))] == ["a_tile"]
        turns = [s for s in statements(low.program.body) if isinstance(s, Transpose) and s.dst.buffer.name == "a_tile"]
        assert bool(turns) == (target is CPU and name in TURNED), (target.name, [str(t) for t in turns])
        if target is CPU:
            for v, got in interpret(low, values):
                c = compare_output(v.name, got, values[id(v)])
                assert c.ok, f"{name} interpreted for {target.name}: {c.problem}"

    cpu_plan_matches(name, model, graph, feeds)
