"""On the CPU an ungrouped 2-D float32 convolution with more than one tap and channels as
rows is computed from its input rows copied zero-padded on chip, K step by K step: each
(channel, tap) is a row of one product at a constant offset of the copy (``TapGemm``,
conv_rows.direct_product), with no im2col tile; the product tile holds the output rows
``padded width`` apart and the epilogue reads them there. The lowered program interprets
like the reference and the compiled plan matches onnxruntime and the reference on fresh
random inputs, across strides (phase planes), dilations, asymmetric pads, batches, K in
several steps and channel counts that are not a multiple of a register block (the CPU
target with minimal filtering off: ResNet's 3 x 3 case is one it takes, test_winograd_tiles.py;
the compiled plan is the default target's). A pointwise
convolution takes it only where its input outgrows the core's cache (else it reads its
input in place); a strided pointwise or grouped convolution, and a GPU, keep their tiles."""
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
from tilefuse.target import CPU, CUDA_SM90A, adjust
from tilefuse.tile_ir.ir import TapGemm, statements
from tilefuse.tile_ir.lower import lower_group

# the schedule these cases test, for 3 x 3 convolutions minimal filtering would take
CPU_DIRECT = adjust(CPU, conv__winograd=False)

CASES = {
    # name: (x shape [N, C, H, W], Cout, kernel, stride, pads, dilation, groups, residual, direct)
    "resnet_3x3_56x56_k_steps": ((1, 64, 56, 56), 64, 3, 1, [1, 1, 1, 1], 1, 1, False, True),
    "stride_2_odd_map": ((1, 8, 15, 17), 24, 3, 2, [1, 1, 1, 1], 1, 1, False, True),
    "stem_7x7_stride_2_three_channels": ((1, 3, 64, 48), 16, 7, 2, [3, 3, 3, 3], 1, 1, False, True),
    "5x5_batch_2_residual": ((2, 10, 20, 19), 20, 5, 1, [2, 2, 2, 2], 1, 1, True, True),
    "asymmetric_pads": ((1, 12, 13, 11), 16, 3, 1, [0, 1, 2, 0], 1, 1, False, True),
    "dilation_2": ((1, 16, 12, 12), 36, 3, 1, [2, 2, 2, 2], 2, 1, False, True),
    "no_padding_stride_3": ((1, 6, 29, 32), 8, 3, 3, [0, 0, 0, 0], 1, 1, False, True),
    # pointwise over more than in_place_max_k channels whose planes outgrow the core's cache
    # (1 MB on the CPU target: 2.3 MB here), unpadded: each plane's rows copied
    "pointwise_past_the_cache": ((1, 192, 56, 48), 40, 1, 1, [0, 0, 0, 0], 1, 1, True, True),
    "pointwise_in_cache_reads_in_place": ((1, 256, 14, 14), 64, 1, 1, [0, 0, 0, 0], 1, 1, False, False),
    "pointwise_stride_2_keeps_tiles": ((1, 32, 28, 28), 16, 1, 2, [0, 0, 0, 0], 1, 1, False, False),
    "grouped_keeps_tiles": ((1, 16, 14, 14), 32, 3, 1, [1, 1, 1, 1], 1, 2, False, False),
}


def _model(x_shape, cout, k, stride, pads, dilation, groups, residual, rng) -> onnx.ModelProto:
    n, cin, h, w = x_shape
    weight = (rng.standard_normal((cout, cin // groups, k, k)) / np.sqrt(cin * k * k / groups)).astype(np.float32)
    scale, shift = rng.uniform(0.5, 1.5, (1, cout, 1, 1)).astype(np.float32), rng.standard_normal((1, cout, 1, 1)).astype(np.float32)
    out = [(d + pads[i] + pads[i + 2] - dilation * (k - 1) - 1) // stride + 1 for i, d in enumerate((h, w))]
    inits = [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(scale, "s"), numpy_helper.from_array(shift, "t")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[k, k], strides=[stride, stride], pads=pads,
                              dilations=[dilation, dilation], group=groups),
             helper.make_node("Mul", ["c", "s"], ["m"]), helper.make_node("Add", ["m", "t"], ["a"])]
    last = "a"
    if residual:
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [n, cout, *out]))
        nodes.append(helper.make_node("Add", ["a", "r"], ["ar"]))
        last = "ar"
    nodes.append(helper.make_node("Relu", [last], ["y"]))
    graph = helper.make_graph(nodes, "direct", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, cout, *out])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("name", list(CASES))
def test_a_convolution_reads_its_padded_input_rows_per_tap(name):
    x_shape, cout, k, stride, pads, dilation, groups, residual, direct = CASES[name]
    rng = np.random.default_rng()
    model = _model(x_shape, cout, k, stride, pads, dilation, groups, residual, rng)
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32)}
    if residual:
        out = model.graph.output[0].type.tensor_type.shape.dim
        feeds["r"] = rng.standard_normal([d.dim_value for d in out]).astype(np.float32)
    graph = import_onnx(model)
    values = evaluate_all(graph, feeds)
    for target in (CPU_DIRECT, CUDA_SM90A):
        (group,) = [g for g in partition_graph(graph, target).groups if str(g.kind) != "opaque"]
        low = lower_group(group, target)
        taps = [s for s in statements(low.program.body) if isinstance(s, TapGemm)]
        want = direct and target is CPU_DIRECT
        width = low.program.schedule.direct_padded_width
        assert bool(taps) == want and bool(width) == want, (name, target.name, low.program.notes)
        if not want:
            continue
        (product,) = taps
        assert not [b.name for b in low.program.allocs if b.name.startswith(("a_tile", "b_tile"))], name
        assert width == -(-(pads[1] + x_shape[3] + pads[3]) // stride), (name, width)
        # the product tile holds whole output rows ``width`` apart, the last one as wide as a row
        out_w = model.graph.output[0].type.tensor_type.shape.dim[3].dim_value
        rows = low.program.schedule.tile_m // out_w
        assert product.c.shape[1] == (rows - 1) * width + out_w, (name, product.c.shape, rows)
        assert len(product.offsets) == low.program.schedule.channels_per_k_tile * k * k
        for v, got in interpret(low, values):
            c = compare_output(v.name, got, values[id(v)])
            assert c.ok, f"{name} interpreted: {c.problem}"
    cpu_plan_matches(name, model, graph, feeds)


def test_the_policy_turns_it_off():
    """``ConvPolicy.direct`` off: the same convolution takes its im2col tile per K step."""
    from tilefuse.target import adjust

    model = _model((1, 16, 14, 14), 32, 3, 1, [1, 1, 1, 1], 1, 1, False, np.random.default_rng(0))
    graph = import_onnx(model)
    target = adjust(CPU_DIRECT, conv__direct=False)
    (group,) = [g for g in partition_graph(graph, target).groups if str(g.kind) != "opaque"]
    program = lower_group(group, target).program
    assert not [s for s in statements(program.body) if isinstance(s, TapGemm)]
    assert program.schedule.direct_padded_width == 0 and any(b.name == "b_tile" for b in program.allocs)
