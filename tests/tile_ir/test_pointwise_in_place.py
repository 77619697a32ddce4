"""On the CPU a float32 pointwise convolution with channels as rows (maps of 56 x 56,
28 x 28, 14 x 14: MobileNet's and EfficientNet's expansions and projections, ResNet's
1 x 1s) has no operand tiles: its weight, bound as [Cout, Cin] rows, and its input's
channel planes are read where they lie by one StridedGemm per K step
(conv_rows.in_place), the weight in the product core's row blocks where the kernels have
AVX-512 (x86-64-v4 here, and native on such a host), as its rows elsewhere. The lowered
program interprets like the reference, the compiled plan matches onnxruntime and the
reference on fresh random inputs, and what does not qualify (a stride, taps, a computed
input) keeps its tiles."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tilefuse.compare import compare_output
from tilefuse.errors import GraphError
from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.reference import evaluate_all
from tilefuse.cpu_isa import requires
from tilefuse.target import CPU, CUDA_SM90A, adjust
from tilefuse.tile_ir.ir import Region, StridedGemm, statements
from tilefuse.tile_ir.lower import lower_group
from tilefuse.tile_ir.verify import verify_program as verify

from tests.tile_ir.compiled import cpu_plan_matches
from tests.tile_ir.interpreted import interpret

# kernels built with AVX-512 (lowered and interpreted here, run only where the host has it)
ROW_BLOCKS = adjust(CPU, codegen__isa="x86-64-v4")
NATIVE_AVX512 = "avx512f" in requires("native")

CASES = {
    # name: (x shape [N, C, H, W], Cout, kernel, stride, computed input, in place)
    "expand_14x14_96_to_576": ((1, 96, 14, 14), 576, 1, 1, False, True),
    "project_28x28_batch2": ((2, 144, 28, 28), 32, 1, 1, False, True),
    "odd_map_many_k_steps": ((1, 600, 15, 17), 64, 1, 1, False, True),
    "tiles_of_125_channels": ((1, 24, 16, 16), 250, 1, 1, False, True),
    "stride_keeps_tiles": ((1, 32, 28, 28), 64, 1, 2, False, False),
    "taps_keep_tiles": ((1, 16, 20, 20), 32, 3, 1, False, False),
    "computed_input_keeps_tiles": ((1, 32, 20, 20), 64, 1, 1, True, False),
}


def _model(x_shape, cout, k, stride, computed, rng) -> onnx.ModelProto:
    cin = x_shape[1]
    w = (rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    pad = k // 2
    nodes = [helper.make_node("Sigmoid", ["x"], ["xs"])] if computed else []
    nodes += [helper.make_node("Conv", ["xs" if computed else "x", "w", "b"], ["c"], kernel_shape=[k, k],
                               strides=[stride, stride], pads=[pad] * 4),
              helper.make_node("Clip", ["c", "lo", "hi"], ["y"])]
    out = (x_shape[2] + 2 * pad - k) // stride + 1, (x_shape[3] + 2 * pad - k) // stride + 1
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
             numpy_helper.from_array(np.array(0, np.float32), "lo"), numpy_helper.from_array(np.array(6, np.float32), "hi")]
    graph = helper.make_graph(nodes, "pointwise", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [x_shape[0], cout, *out])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("name", list(CASES))
def test_a_pointwise_convolution_reads_its_operands_in_place(name):
    x_shape, cout, k, stride, computed, in_place = CASES[name]
    rng = np.random.default_rng()
    model = _model(x_shape, cout, k, stride, computed, rng)
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32)}
    graph = import_onnx(model)
    values = evaluate_all(graph, feeds)
    for target in (CPU, ROW_BLOCKS, CUDA_SM90A):
        groups = [g for g in partition_graph(graph, target).groups if str(g.kind) != "opaque"]
        low = lower_group(groups[-1], target)
        strided = [s for s in statements(low.program.body) if isinstance(s, StridedGemm)]
        want = in_place and target is not CUDA_SM90A
        assert bool(strided) == want and low.program.schedule.operands_in_place == want, (target.name, low.program.notes)
        if want and (target is ROW_BLOCKS or NATIVE_AVX512):  # the weight in the core's row blocks (row_blocks.py)
            assert all(s.a_blocks == s.c.shape[0] == s.a.extents[0] for s in strided), strided
            assert any(v.name.endswith(f".rowblocks{strided[0].a_blocks}") for v in low.bindings), low.bindings
        elif want:  # the AVX2 core would turn each block back into rows: the weight's rows
            assert all(s.a_blocks == 0 for s in strided), strided
            assert any(v.name.endswith(".rows") for v in low.bindings), low.bindings
        if want:
            assert low.program.schedule.channel_rows
            assert not [b.name for b in low.program.allocs if b.name.startswith(("a_tile", "b_tile"))]
            assert "where they lie" in low.program.notes[0]
        if target is not CUDA_SM90A:
            for g in groups:
                for v, got in interpret(lower_group(g, target), values):
                    c = compare_output(v.name, got, values[id(v)])
                    assert c.ok, f"{name} interpreted: {c.problem}"
    cpu_plan_matches(name, model, graph, feeds)


def test_without_row_blocks_the_weight_is_read_as_its_rows():
    """``ConvPolicy.row_blocks`` off: the same product on the weight's rows as stored
    (a_blocks 0), interpreted and compiled alike."""
    x_shape, cout = (1, 40, 14, 14), 100
    rng = np.random.default_rng()
    model = _model(x_shape, cout, 1, 1, False, rng)
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32)}
    graph = import_onnx(model)
    rows = adjust(CPU, conv__row_blocks=False)
    (g,) = [g for g in partition_graph(graph, rows).groups if str(g.kind) != "opaque"]
    low = lower_group(g, rows)
    strided = [s for s in statements(low.program.body) if isinstance(s, StridedGemm)]
    assert strided and all(s.a_blocks == 0 for s in strided)
    assert any(v.name.endswith(".rows") for v in low.bindings), low.bindings
    values = evaluate_all(graph, feeds)
    for v, got in interpret(low, values):
        c = compare_output(v.name, got, values[id(v)])
        assert c.ok, c.problem
    cpu_plan_matches("pointwise_rows", model, graph, feeds, target=rows)


def test_verify_names_a_row_blocked_product_that_is_not_one_tile():
    model = _model((1, 40, 14, 14), 100, 1, 1, False, np.random.default_rng(0))
    graph = import_onnx(model)
    (g,) = [g for g in partition_graph(graph, ROW_BLOCKS).groups if str(g.kind) != "opaque"]
    program = lower_group(g, ROW_BLOCKS).program
    (s,) = [s for s in statements(program.body) if isinstance(s, StridedGemm)]
    assert s.a_blocks
    bad = _replace(program, s, StridedGemm(s.a, s.b, s.k_axis, s.c, a_blocks=s.a_blocks + 1))
    with pytest.raises(GraphError, match="not one whole tile"):
        verify(bad, ROW_BLOCKS)


def test_verify_names_a_strided_product_whose_rows_are_not_runs():
    # (160 input channels: a wide tile, whose nests 128 threads split, so the GPU's
    # verifier comes to the product; over 128 or fewer it takes 12-channel tiles)
    model = _model((1, 160, 14, 14), 576, 1, 1, False, np.random.default_rng(0))
    graph = import_onnx(model)
    (g,) = [g for g in partition_graph(graph, CPU).groups if str(g.kind) != "opaque"]
    program = lower_group(g, CPU).program
    verify(program, CPU)
    (s,) = [s for s in statements(program.body) if isinstance(s, StridedGemm)]
    half_rows = Region(s.b.buffer, s.b.offsets, (*s.b.extents[:-1], s.b.extents[-1] // 2))
    bad = _replace(program, s, StridedGemm(s.a, half_rows, s.k_axis, s.c))
    with pytest.raises(GraphError, match="are not runs"):
        verify(bad, CPU)
    with pytest.raises(GraphError, match="host's product core"):
        verify(program, CUDA_SM90A)


def _replace(program, old, new):
    from dataclasses import replace

    from tilefuse.tile_ir.ir import If, Loop

    def walk(stmts):
        out = []
        for s in stmts:
            if s is old:
                out.append(new)
            elif isinstance(s, (Loop, If)):
                out.append(replace(s, body=tuple(walk(s.body))))
            else:
                out.append(s)
        return out

    return replace(program, body=tuple(walk(program.body)))
