"""A product by packed panels whose last column tile is partial computes only the panels
that hold columns (``PanelGemm.columns``): the float core and the u8 x s8 integer cores
(int8 panels, and int16 ones for kernels without VNNI), each C kernel against the tile interpreter and a numpy product on fresh random inputs.
Two column tiles of 96 over 160 columns: the second computes 64; the stores clamp their
columns to the last one, as a product's epilogue does, and read only computed columns."""
from __future__ import annotations

import re

import numpy as np
import pytest

from tests.codegen.cpu_programs import assert_same, param, program, run_both
from tilefuse.codegen.cpu import build_all, emit_program
from tilefuse.ir.dtypes import DType
from tilefuse.target import CPU
from tilefuse.tile_ir.ir import Buffer, Const, Fill, IOp, Load, Loop, LoopKind, PanelGemm, Region, Scope, Store, Var, const_index, iop
from tilefuse.tile_ir.lower.panels import pack
from tilefuse.tile_ir.verify import verify_program

M, K, N, TILE, WIDTH = 13, 40, 160, 96, 32


def _program(integer: DType | None):
    a_t, b_t, c_t = (DType.UINT8, integer, DType.INT32) if integer else (DType.FLOAT32,) * 3
    tiles = -(-N // TILE)
    panels = tiles * TILE // WIDTH
    a = param("a", a_t, (M, K))
    b = param("b", b_t, (panels, -(-K // 4), WIDTH * 4) if integer else (panels, K, WIDTH))
    out = param("out", c_t, (M, N))
    c = Buffer("c_tile", c_t, (M, TILE), Scope.FRAGMENT)
    bx, i, j = Var("bx"), Var("i"), Var("j")
    columns = iop(IOp.MIN, const_index(TILE), iop(IOp.SUB, const_index(-(-N // WIDTH) * WIDTH), iop(IOp.MUL, bx, TILE)))
    col = iop(IOp.MIN, iop(IOp.ADD, iop(IOp.MUL, bx, TILE), j), const_index(N - 1))  # clamped, as an epilogue's
    body = [Fill(c, Const(0, c_t)),
            PanelGemm(Region(a, (const_index(0), const_index(0)), (M, K)), b, iop(IOp.MUL, bx, TILE // WIDTH),
                      const_index(0), c, 256, columns),
            Loop(i, M, LoopKind.PARALLEL, (Loop(j, TILE, LoopKind.PARALLEL, (
                Store(out, (i, col), Load(c, (i, iop(IOp.SUB, col, iop(IOp.MUL, bx, TILE))))),)),))]
    return program(f"panel_columns_{integer.value if integer else 'f32'}", [a, b], [out], body, allocs=[c], grid=(tiles,)), panels


@pytest.mark.parametrize("integer", [None, DType.INT8, DType.INT16], ids=["float32", "int8", "int16"])
def test_a_partial_last_column_tile_computes_its_panels(integer):
    p, panels = _program(integer)
    assert verify_program(p, CPU) is None
    rng = np.random.default_rng()
    if integer:
        a = rng.integers(0, 256, (M, K)).astype(np.uint8)
        w = rng.integers(-128, 128, (K, N)).astype(np.int32)
        want = a.astype(np.int64) @ w
    else:
        a = rng.standard_normal((M, K)).astype(np.float32)
        w = rng.standard_normal((K, N)).astype(np.float32)
        want = a.astype(np.float64) @ w
    b = pack(w, WIDTH, panels * WIDTH, integer=integer)
    core = re.search(r"tf_panel_gemm_(f32|u8s8|u8s16)\(13, ([^,]+),", emit_program(p).text)
    assert core and core.group(1) == {None: "f32", DType.INT8: "u8s8", DType.INT16: "u8s16"}[integer], core
    assert core.group(2) != str(TILE), core  # the core's column count, not the tile's
    (artifact,) = build_all([p])
    got, interpreted = run_both(p, artifact, [a, b])
    assert_same(p, got, interpreted, rtol=None if integer else {"out": 1e-5})  # (a float core sums in its own order)
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-4)
