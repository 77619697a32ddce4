"""On the CPU a convolution with positions as rows (a 7 x 7 map) writes each output channel
across its tile: the store's order reads the accumulator with a stride and GCC leaves the
epilogue's math scalar. The host turns the accumulator tile into the store's order with
its block transpose (GemmPolicy.turned_epilogue) and computes every such epilogue there,
in vectors. With that off, an epilogue that is costly (staged_epilogue_flops: a SiLU's
sigmoid, a GELU's erf) or selects (staged_epilogue_selects: ReLU, Clip, a branch an
element in scalar code) is computed in the tile's order into a staging tile and then
copied out; a cheap one (a bias, a residual) and the GPU store as before. The
lowered program interprets like the reference, and the compiled plan matches onnxruntime
and the reference on fresh random inputs, with a residual input read in the epilogue, a
column tail and a partial row tile."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tilefuse.compare import compare_output
from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.reference import evaluate_all
from tilefuse.target import CPU, CUDA_SM90A, adjust
from tilefuse.tile_ir.lower import lower_group

from tests.tile_ir.compiled import cpu_plan_matches
from tests.tile_ir.interpreted import interpret

STAGED = adjust(CPU, gemm__turned_epilogue=False)  # the staging tile where the epilogue is costly or selects

CASES = {
    # name: (x shape [N, C, H, W], Cout, activation, residual)
    "silu_7x7_192_to_1152": ((1, 192, 7, 7), 1152, "silu", False),
    "gelu_column_tail_residual": ((1, 96, 7, 7), 200, "gelu", True),
    "silu_odd_map_two_images": ((2, 40, 5, 9), 72, "silu", False),
    "relu": ((1, 64, 7, 7), 96, "relu", False),
    "clip_residual_column_tail": ((1, 48, 7, 7), 80, "clip", True),
    "residual_stays_as_it_was": ((1, 64, 7, 7), 96, "none", True),
}


def _model(x_shape, cout, act, residual, rng) -> onnx.ModelProto:
    cin = x_shape[1]
    w = (rng.standard_normal((cout, cin, 1, 1)) / np.sqrt(cin)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    out_shape = [x_shape[0], cout, x_shape[2], x_shape[3]]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[1, 1])]
    if act == "silu":
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["a"])]
    elif act == "gelu":
        nodes += [helper.make_node("Gelu", ["c"], ["a"], domain="")]
    elif act == "clip":
        lo, hi = helper.make_tensor("lo", TensorProto.FLOAT, [], [0.0]), helper.make_tensor("hi", TensorProto.FLOAT, [], [6.0])
        nodes += [helper.make_node("Constant", [], ["lo"], value=lo), helper.make_node("Constant", [], ["hi"], value=hi),
                  helper.make_node("Clip", ["c", "lo", "hi"], ["a"])]
    elif act == "relu":
        nodes += [helper.make_node("Relu", ["c"], ["a"])]
    else:
        nodes += [helper.make_node("Identity", ["c"], ["a"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
    if residual:
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, out_shape))
        nodes.append(helper.make_node("Add", ["a", "r"], ["y"]))
    else:
        nodes[-1].output[0] = "y"
    graph = helper.make_graph(nodes, "conv", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    opset = 20 if act == "gelu" else 17
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("name", list(CASES))
def test_an_epilogue_across_the_tile_reads_the_accumulator_turned_or_staged(name):
    x_shape, cout, act, residual = CASES[name]
    rng = np.random.default_rng()
    model = _model(x_shape, cout, act, residual, rng)
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32)}
    if residual:
        feeds["r"] = rng.standard_normal((x_shape[0], cout, *x_shape[2:])).astype(np.float32)
    graph = import_onnx(model)
    values = evaluate_all(graph, feeds)
    for target in (CPU, STAGED, CUDA_SM90A):
        (g,) = [g for g in partition_graph(graph, target).groups if str(g.kind) != "opaque"]
        low = lower_group(g, target)
        assert not low.program.schedule.channel_rows, low.program.notes  # positions as rows: the case under test
        staged = [b.name for b in low.program.allocs if b.name.startswith("e_tile")]
        turned = [b.name for b in low.program.allocs if b.name.startswith("t_c_tile")]
        assert (bool(turned), bool(staged)) == (target is CPU, target is STAGED and act != "none"), (target.name, staged, turned)
        assert len(turned) <= 1
        if target is not CUDA_SM90A:
            for v, got in interpret(low, values):
                c = compare_output(v.name, got, values[id(v)])
                assert c.ok, f"{name} interpreted: {c.problem}"

    cpu_plan_matches(name, model, graph, feeds)
    cpu_plan_matches(name, model, graph, feeds, target=STAGED)
