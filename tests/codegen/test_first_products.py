"""Products that start their tile at zero (codegen/cpu/first_products.py): a zero Fill of a
local tile followed by a float32 product into all of it, or by a K loop whose first use of
the tile is such a product, is not printed; the product core starts its registers at zero
(always, or on the loop's first step), and the tile is allocated without zeroing. Where
anything else reads the tile first, the Fill stays. The C kernels match the tile
interpreter; compiled models match onnxruntime and the reference on fresh random inputs."""
from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.codegen.cpu_programs import assert_same, elementwise, load, param, program, run_both
from tests.tile_ir.compiled import cpu_plan_matches
from tilefuse.cpu_isa import requires
from tilefuse.codegen.cpu import build_all
from tilefuse.codegen.cpu.emit import emit_program
from tilefuse.frontend import import_onnx
from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ScalarFn
from tilefuse.partition import partition_graph
from tilefuse.target import CPU
from tilefuse.tile_ir.ir import (Buffer, Call, Const, Copy, Fill, Gemm, IOp, Loop, LoopKind, Region, Scope, Store,
                                 Var, const_index, iop)
from tilefuse.tile_ir.lower import lower_group

M, K, N, STEPS = 13, 8, 40, 3


def _k_loop_program(first_in_loop: list, fill_value: float = 0.0, trans: bool = False):
    """out = 2 * (A @ B) over K in STEPS steps of K, through local tiles; ``first_in_loop``:
    statements put before the product in the loop's body."""
    a, b = param("a", DType.FLOAT32, (M, K * STEPS)), param("b", DType.FLOAT32, (K * STEPS, N))
    out = param("out", DType.FLOAT32, (M, N))
    at = Buffer("at", DType.FLOAT32, (K, M) if trans else (M, K), Scope.SHARED)
    bt = Buffer("bt", DType.FLOAT32, (K, N), Scope.SHARED)
    c = Buffer("c_tile", DType.FLOAT32, (M, N), Scope.SHARED)
    kt = Var("kt")
    k0 = iop(IOp.MUL, kt, K)
    if trans:  # A's tile transposed: a product off the core's fast path
        a_tile = elementwise(at, lambda i: load(a, (i[1], iop(IOp.ADD, k0, i[0]))))
    else:
        a_tile = Copy(Region(a, (const_index(0), k0), (M, K)), Region(at, (const_index(0), const_index(0)), (M, K)))
    body = [
        Fill(c, Const(fill_value, DType.FLOAT32)),
        Loop(kt, STEPS, LoopKind.SERIAL, (
            a_tile,
            Copy(Region(b, (k0, const_index(0)), (K, N)), Region(bt, (const_index(0), const_index(0)), (K, N))),
            *first_in_loop(c),
            Gemm(at, bt, c, trans_a=trans),
        )),
        elementwise(out, lambda i: Call(ScalarFn.MUL, (load(c, i), Const(2.0, DType.FLOAT32)), DType.FLOAT32)),
    ]
    return program("k_loop", [a, b], [out], body, allocs=[at, bt, c])


def _run(p) -> None:
    """The C kernel against the tile interpreter on fresh random inputs."""
    (artifact,) = build_all([p])
    rng = np.random.default_rng()
    inputs = [rng.standard_normal(b.shape).astype(np.float32) for b in p.params[: p.num_inputs]]
    got, want = run_both(p, artifact, inputs)
    assert_same(p, got, want, rtol={"out": 1e-5})


def _body(p) -> str:
    text = emit_program(p).text
    return text[text.index("(void **args)\n{"):]


def test_a_k_loops_first_product_starts_the_tile_at_zero():
    p = _k_loop_program(lambda c: [])
    body = _body(p)
    assert "memset(c_tile" not in body, body
    assert re.search(r"tf_gemm_f32\([^;]*, kt == 0\);", body), body
    assert re.search(r"float c_tile\[\d+\] __attribute__\(\(aligned\(64\)\)\);", body), body  # not zeroed
    _run(p)


def test_a_tile_read_before_the_product_keeps_its_fill():
    def bump(c):  # c[0, 0] += 1 before each product: the tile must start at zero
        at = (const_index(0), const_index(0))
        return [Store(c, at, Call(ScalarFn.ADD, (load(c, at), Const(1.0, DType.FLOAT32)), DType.FLOAT32))]

    p = _k_loop_program(bump)
    body = _body(p)
    assert "memset(c_tile, 0," in body and re.search(r"tf_gemm_f32\([^;]*, 0\);", body), body
    _run(p)


@pytest.mark.parametrize("fill_value, trans", [(-0.0, False), (0.5, False), (0.0, True)])
def test_other_fills_and_products_keep_the_fill(fill_value, trans):
    """-0.0 is not +0.0 (a product of zeros adds to -0.0 as -0.0); a nonzero start; a
    transposed operand (the plain loops, which take no flag)."""
    p = _k_loop_program(lambda c: [], fill_value=fill_value, trans=trans)
    body = _body(p)
    assert "kt == 0" not in body and re.search(r"memset\(c_tile, 0,|c_tile\[_i\] = ", body), body
    _run(p)


def _matmul(m: int, k: int, n: int, rng):
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _pointwise(channels: int, out_channels: int, size: int, rng):
    w = (rng.standard_normal((out_channels, channels, 1, 1)) / np.sqrt(channels)).astype(np.float32)
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"])], "pw",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, out_channels, size, size])],
                          [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _kernel_body(model) -> str:
    graph = import_onnx(model)
    (g,) = [g for g in partition_graph(graph, CPU).groups if str(g.kind) != "opaque"]
    return _body(lower_group(g, CPU).program)


@pytest.mark.parametrize("m, k, n", [(128, 768, 96), (100, 520, 64), (7, 40, 32), (131, 64, 64)])
def test_products_by_packed_weights_start_at_zero(m, k, n):
    """A weight packed in panels, read in K blocks (the flag on the first); 131 rows in row
    tiles of 66: the last tile's rows stop short of it, so the tile is zeroed first and the
    product accumulates."""
    rng = np.random.default_rng()
    model = _matmul(m, k, n, rng)
    body = _kernel_body(model)
    partial = m == 131
    assert "tf_panel_gemm_f32" in body, body
    assert bool(re.search(r"tf_panel_gemm_f32\([^;]*, 0\);", body)) == partial, body
    assert ("memset(c_tile, 0," in body) == partial, body
    cpu_plan_matches(f"matmul{m}x{k}x{n}", model, import_onnx(model), {"x": rng.standard_normal((m, k)).astype(np.float32)})


def test_a_pointwise_convolution_in_place_starts_at_zero():
    """(its weight in the block core's row blocks where the kernels have AVX-512, as rows
    on the plain core elsewhere: conv_rows.has_avx512)"""
    rng = np.random.default_rng()
    model = _pointwise(32, 64, 28, rng)
    body = _kernel_body(model)
    core = "tf_gemm_blocks_f32" if "avx512f" in requires("native") else "tf_gemm_f32"
    assert re.search(core + r"\([^;]*, (1|kt\d* == 0)\);", body) and "memset(c_tile" not in body, body
    cpu_plan_matches("pointwise", model, import_onnx(model), {"x": rng.standard_normal((1, 32, 28, 28)).astype(np.float32)})


def _copy_program(rows: int, fill: float | None, reads_itself: bool = False):
    """out = 3 * t, t a local [13, 20] tile first written by a nest over ``rows`` of its
    rows (from x); ``fill``: a Fill of t before that nest."""
    x, out = param("x", DType.FLOAT32, (13, 20)), param("out", DType.FLOAT32, (13, 20))
    t = Buffer("t_tile", DType.FLOAT32, (13, 20), Scope.SHARED)

    def value(i):
        v = load(x, i)
        return Call(ScalarFn.ADD, (v, load(t, i)), DType.FLOAT32) if reads_itself else v

    nest = Loop(Var("r"), rows, LoopKind.PARALLEL, (Loop(Var("q"), 20, LoopKind.PARALLEL, (
        Store(t, (Var("r"), Var("q")), value((Var("r"), Var("q")))),)),))
    body = [*([Fill(t, Const(fill, DType.FLOAT32))] if fill is not None else []), nest,
            elementwise(out, lambda i: Call(ScalarFn.MUL, (load(t, i), Const(3.0, DType.FLOAT32)), DType.FLOAT32))]
    return program("copy_first", [x], [out], body, allocs=[t])


@pytest.mark.parametrize("rows, fill, reads_itself, zeroed, filled", [
    (13, None, False, False, False),  # every element stored first: no zeroing
    (12, None, False, True, False),   # a row left out: the allocation stays zeroed
    (13, None, True, True, False),    # the nest reads the tile: zeroed
    (13, 0.5, False, False, False),   # a Fill overwritten whole before it is read: not printed
    (12, 0.5, False, False, True),    # a Fill a row of which is read: printed (and it zeroes the tile)
])
def test_tiles_written_whole_first_are_not_zeroed(rows, fill, reads_itself, zeroed, filled):
    p = _copy_program(rows, fill, reads_itself)
    body = _body(p)
    assert bool(re.search(r"float t_tile\[260\] __attribute__\(\(aligned\(64\)\)\) = \{0\};", body)) == zeroed, body
    assert ("t_tile[_i] = 0.5f" in body) == filled, body
    _run(p)


def _runs_program(step: int, runs: int, width: int):
    """out = 3 * t, t a local tile of 4 rows first written by a nest storing each of its
    rows as ``runs`` runs of ``width`` at ``r * step + q`` (a depthwise convolution's sums
    copied row by row into its product tile), from x."""
    cols = max(runs * width, (runs - 1) * step + width)
    x, out = param("x", DType.FLOAT32, (4, cols + step)), param("out", DType.FLOAT32, (4, cols))
    t = Buffer("t_tile", DType.FLOAT32, (4, cols), Scope.SHARED)
    i, r, q = Var("i"), Var("r"), Var("q")
    at = iop(IOp.ADD, iop(IOp.MUL, r, step), q)
    nest = Loop(i, 4, LoopKind.PARALLEL, (Loop(r, runs, LoopKind.PARALLEL, (Loop(q, width, LoopKind.PARALLEL, (
        Store(t, (i, at), load(x, (i, at))),)),)),))
    body = [Fill(t, Const(0.0, DType.FLOAT32)), nest,
            elementwise(out, lambda ix: Call(ScalarFn.MUL, (load(t, ix), Const(3.0, DType.FLOAT32)), DType.FLOAT32))]
    return program("runs_first", [x], [out], body, allocs=[t])


@pytest.mark.parametrize("step, runs, width, whole", [
    (20, 3, 20, True),    # rows as 3 runs of 20, back to back: every element stored, no zeroing
    (16, 3, 20, False),   # runs that overlap: the last 8 of 60 columns never stored, the Fill stays
    (24, 2, 20, False),   # runs with gaps between them (columns 20-23)
])
def test_a_tile_stored_as_runs_of_its_rows(step, runs, width, whole):
    p = _runs_program(step, runs, width)
    body = _body(p)
    zeroed = bool(re.search(r"float t_tile\[\d+\] __attribute__\(\(aligned\(64\)\)\) = \{0\};", body))
    assert ("memset(t_tile, 0," in body) == (not whole) and not (whole and zeroed), body
    _run(p)


def _pieces_program(pieces: list[tuple[int, int, bool]]):
    """out = 3 * t, t a local 13 x 20 tile first written by one nest per piece (first
    column, columns, zeros?): x's columns there, or zeros (a zero-padded copy of input rows,
    its padding stored by nests of its own: conv_rows._padded_copy)."""
    x, out = param("x", DType.FLOAT32, (13, 20)), param("out", DType.FLOAT32, (13, 20))
    t = Buffer("t_tile", DType.FLOAT32, (13, 20), Scope.SHARED)
    body: list = []
    for n, (start, cols, zeros) in enumerate(pieces):
        r, q = Var(f"r{n}"), Var(f"q{n}")
        at = (r, iop(IOp.ADD, q, const_index(start)) if start else q)
        value = Const(0.0, DType.FLOAT32) if zeros else load(x, at)
        body.append(Loop(r, 13, LoopKind.PARALLEL, (Loop(q, cols, LoopKind.PARALLEL, (Store(t, at, value),)),)))
    body.append(elementwise(out, lambda i: Call(ScalarFn.MUL, (load(t, i), Const(3.0, DType.FLOAT32)), DType.FLOAT32)))
    return program("pieces_first", [x], [out], body, allocs=[t])


@pytest.mark.parametrize("pieces, whole", [
    ([(1, 18, False), (0, 1, True), (19, 1, True)], True),   # a copy and its two padding columns
    ([(0, 12, False), (12, 8, False)], True),                # two copies side by side
    ([(1, 18, False), (0, 1, True)], False),                 # the last column never stored: zeroed
    ([(0, 10, False), (11, 9, True)], False),                # column 10 never stored
])
def test_a_tile_stored_in_pieces(pieces, whole):
    p = _pieces_program(pieces)
    body = _body(p)
    zeroed = bool(re.search(r"float t_tile\[260\] __attribute__\(\(aligned\(64\)\)\) = \{0\};", body))
    assert zeroed == (not whole), body
    _run(p)
