"""A pointwise convolution's epilogue run per register block (codegen/cpu/block_epilogues.py),
and the few-channel, whole-plane tiles that take it (ConvPolicy.in_place_channels).

A float32 pointwise convolution read in place over at most ``in_place_max_k`` input channels,
whose input planes take at most half a core's cache (1 MB on the default CPU target), takes tiles of a few output channels by whole planes; its product then runs in register
blocks, each followed at once by the epilogue's rows and columns of that block (a residual,
a bias, an activation), and its accumulator tile is never allocated. Tiles of more rows
run so too, a row of blocks at a time, where the product's B part (K x the tile's
columns) fits the first-level cache; the others keep the tile-wide epilogue. Plans match
onnxruntime and the reference on fresh random inputs: odd planes (columns past the last whole block), a batch, K in several steps,
channels that are not a multiple of a block's rows."""
from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.tile_ir.compiled import cpu_plan_matches
from tilefuse.codegen.cpu import block_epilogues, first_products
from tilefuse.codegen.cpu.emit import emit_program
from tilefuse.codegen.cpu.flat_access import flatten_accesses
from tilefuse.codegen.options import CpuOptions
from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.target import CPU
from tilefuse.tile_ir.ir import Load, Loop, Store, StridedGemm, const_index, statements
from tilefuse.tile_ir.lower import lower_group

LIMITS = block_epilogues.Limits(CpuOptions().block_epilogue_rows, CpuOptions().block_epilogue_b_bytes)

CASES = {
    # name: (x shape [N, C, H, W], Cout, residual, activation, per block (None: no;
    # "columns": a column of blocks at a time; "rows": a row of them), whole planes)
    "projection_56x56_residual": ((1, 32, 56, 56), 128, True, "Relu", "columns", True),
    "odd_plane_batch2_clip": ((2, 24, 15, 17), 36, False, "Clip", "columns", True),
    "mobilenet_expansion_56x56": ((1, 24, 56, 56), 144, False, "Clip", "columns", True),
    "planes_past_half_the_cache": ((1, 16, 112, 112), 96, False, "Clip", "rows", False),
    "channels_of_10_sigmoid": ((1, 40, 20, 20), 50, True, "Sigmoid", "columns", True),
    "few_channels_many_k_steps": ((1, 600, 9, 9), 20, False, "Sigmoid", "columns", False),
    "wide_k_keeps_wide_tiles": ((1, 256, 14, 14), 128, True, "Relu", None, False),
    "tall_tile_odd_columns_sigmoid": ((1, 8, 131, 127), 72, True, "Sigmoid", "rows", False),
}


def _model(x_shape, cout, residual, activation, rng) -> onnx.ModelProto:
    n, cin, h, w = x_shape
    weight = (rng.standard_normal((cout, cin, 1, 1)) / np.sqrt(cin)).astype(np.float32)
    bias = rng.standard_normal(cout).astype(np.float32)
    inits = [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b"),
             numpy_helper.from_array(np.array(0, np.float32), "lo"), numpy_helper.from_array(np.array(6, np.float32), "hi")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[1, 1])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
    last = "c"
    if residual:
        nodes.append(helper.make_node("Add", ["c", "r"], ["s"]))
        inputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [n, cout, h, w]))
        last = "s"
    extra = ["lo", "hi"] if activation == "Clip" else []
    nodes.append(helper.make_node(activation, [last, *extra], ["y"]))
    graph = helper.make_graph(nodes, "pointwise", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, cout, h, w])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _program(model):
    graph = import_onnx(model)
    (g,) = [g for g in partition_graph(graph, CPU).groups if str(g.kind) != "opaque"]
    return graph, lower_group(g, CPU).program


@pytest.mark.parametrize("name", list(CASES))
def test_a_pointwise_epilogue_runs_per_register_block(name):
    x_shape, cout, residual, activation, per_block, planes = CASES[name]
    rng = np.random.default_rng()
    model = _model(x_shape, cout, residual, activation, rng)
    graph, program = _program(model)
    (product,) = [s for s in statements(program.body) if isinstance(s, StridedGemm)]
    rows, columns = product.c.shape
    plane = x_shape[2] * x_shape[3]
    assert (columns == plane and rows <= CPU.conv.in_place_channels) == planes, (name, product.c.shape)
    text = emit_program(program).text
    body = text[text.index("(void **args)\n{"):]
    flat = flatten_accesses(program)  # (as the printer plans it)
    fused = block_epilogues.plan(flat, first_products.plan(flat), LIMITS)
    order = None if not fused else ("rows" if next(iter(fused.values())).rows_outer else "columns")
    assert order == per_block, (name, product.c.shape, program.notes)
    assert ("c_tile[" not in body and "_cb" in body) == bool(per_block), body
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32)}
    if residual:
        feeds["r"] = rng.standard_normal((x_shape[0], cout, *x_shape[2:])).astype(np.float32)
    cpu_plan_matches(name, model, graph, feeds)


def test_an_epilogue_reading_other_elements_keeps_the_tile():
    """An epilogue that reads the accumulator anywhere but at its own element needs the
    whole tile: not run per block."""
    model = _model((1, 32, 16, 16), 24, False, "Relu", np.random.default_rng(0))
    program = flatten_accesses(_program(model)[1])
    starts = first_products.plan(program)
    assert block_epilogues.plan(program, starts, LIMITS)
    (product,) = [s for s in statements(program.body) if isinstance(s, StridedGemm)]
    c = product.c

    def first_column(e):
        if isinstance(e, Load) and e.buffer == c:
            return Load(c, (e.indices[0], const_index(0)))
        return e

    def rewrite(s):
        if isinstance(s, Loop):
            return replace(s, body=tuple(rewrite(x) for x in s.body))
        if isinstance(s, Store):
            return replace(s, value=_map(s.value, first_column))
        return s

    shifted = replace(program, body=tuple(rewrite(s) for s in program.body))
    assert not block_epilogues.plan(shifted, first_products.plan(shifted), LIMITS)


def _map(e, fn):
    from tilefuse.tile_ir.ir import Call, IndexOp

    if isinstance(e, Call):
        return Call(e.fn, tuple(_map(a, fn) for a in e.args), e.dtype)
    if isinstance(e, IndexOp):
        return IndexOp(e.op, _map(e.a, fn), _map(e.b, fn))
    return fn(e)


@pytest.mark.parametrize("m, avx512, blocks", [
    (16, False, [(0, 11), (11, 5)]), (12, False, [(0, 12)]), (5, False, [(0, 5)]), (20, False, [(0, 12), (12, 8)]),
    (24, False, [(0, 12), (12, 12)]), (16, True, [(0, 8), (8, 8)]), (30, True, [(0, 12), (12, 9), (21, 9)])])
def test_register_blocks_follow_the_cores_rule(m, avx512, blocks):
    assert block_epilogues.register_blocks(m, avx512) == blocks


@pytest.mark.parametrize("isa, heights", [("x86-64-v3", {11, 5}), ("x86-64-v2", {11, 5}), ("x86-64-v4", {8})])
def test_the_blocks_are_the_register_blocks_of_the_kernels_isa(isa, heights):
    """MobileNetV2's 32 -> 16 projection: without AVX-512 calls of 11 and 5 rows (the
    8-float core's strips of 6, 5 and 5), with it 8 and 8 (AVX-512's); the plan on this
    host matches onnxruntime."""
    rng = np.random.default_rng()
    model = _model((1, 32, 112, 112), 16, False, "Clip", rng)
    graph, program = _program(model)
    text = emit_program(program, CpuOptions(isa=isa)).text
    assert {int(h) for h in re.findall(r"tf_gemm_f32\((\d+), 32, ", text)} == heights, text
    cpu_plan_matches("projection_32_16", model, graph, {"x": rng.standard_normal((1, 32, 112, 112)).astype(np.float32)})
