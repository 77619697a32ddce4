"""Generated C computes what the tile interpreter computes: every scalar function on every
kind of dtype (special values included), casts, index arithmetic on negative numbers,
guarded loads, and the tile statements (Copy with tails, Fill, Gemm, ReduceTile), a
parallel tile grid and heap-allocated tile buffers.

All programs are built with one build_all call (in parallel, cached)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tests.codegen.cpu_programs import assert_same, elementwise, load, param, parallel, program, run_both
from tilefuse.codegen.cpu import build_all
from tilefuse.codegen.cpu.emit import emit_program
from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ReduceFn, ScalarFn
from tilefuse.tile_ir.ir import (
    Buffer, Call, Const, Copy, Fill, Gemm, If, IOp, Loop, LoopKind, ReduceTile, Region, Scope, Store, Var, const_index,
    iop,
)

F = ScalarFn
FLOAT_UNARY = [F.NEG, F.ABS, F.SIGN, F.RECIPROCAL, F.SQRT, F.EXP, F.LOG, F.FLOOR, F.CEIL, F.ROUND, F.ERF, F.TANH,
               F.SIGMOID, F.SIN, F.COS, F.TAN, F.ASIN, F.ACOS, F.ATAN, F.SINH, F.COSH, F.ASINH, F.ACOSH, F.ATANH]
FLOAT_BINARY = [F.ADD, F.SUB, F.MUL, F.DIV, F.POW, F.MOD, F.FMOD, F.MAX, F.MIN]
INT_UNARY = [F.NEG, F.ABS, F.SIGN, F.BITNOT]
INT_BINARY = [F.ADD, F.SUB, F.MUL, F.DIV, F.MOD, F.FMOD, F.MAX, F.MIN, F.BITAND, F.BITOR, F.BITXOR]
COMPARE = [F.EQ, F.LT, F.LE, F.GT, F.GE]
# transcendental results may differ from numpy's by an ulp or so
INEXACT = {F.EXP, F.LOG, F.ERF, F.TANH, F.SIGMOID, F.SIN, F.COS, F.TAN, F.ASIN, F.ACOS, F.ATAN, F.SINH, F.COSH,
           F.ASINH, F.ACOSH, F.ATANH, F.POW}
ULPS = {DType.FLOAT32: 1e-6, DType.FLOAT64: 1e-14, DType.FLOAT16: 1e-3, DType.BFLOAT16: 8e-3}

N = 24
FLOAT_X = [np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, 1.5, 2.5, -2.5, -1.7, 3.3, 100.0, -100.0, 1e-3, 0.9, -0.9,
           88.5, -88.5, 1e30, 7.0, -7.0, 0.25, 4.0, -3.0]
FLOAT_Y = [2.0, 0.0, -3.0, 0.0, 5.0, -0.5, 2.0, 1.0, 3.0, -2.0, 0.0, 7.0, -7.0, 2.0, np.nan, 1.5, -1.0, 3.0, 2.0,
           -2.0, 3.0, -0.25, 0.5, -3.0]
INT_X = [0, 1, -1, 7, -7, 100, -100, 127, -128, 3, -3, 64, 5, -5, 9, -9, 12, 13, -13, 2, 50, -50, 33, 6]
INT_Y = [3, 0, -1, 2, -2, 3, 7, -1, -1, 0, 2, -3, 5, 5, -4, 4, 1, 2, 3, -2, 7, 6, -5, 2]
CAST_DTYPES = [DType.FLOAT32, DType.FLOAT64, DType.FLOAT16, DType.BFLOAT16, DType.INT8, DType.INT32, DType.INT64,
               DType.UINT8, DType.BOOL]


def _array(values, dtype: DType) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(values, dtype=np.float64 if dtype.is_float else np.int64).astype(dtype.numpy)


def _scalar_program(dtype: DType):
    x, y = param("x", dtype, (N,)), param("y", dtype, (N,))
    body, outs, rtol = [], [], {}
    unary = FLOAT_UNARY + [F.ISNAN, F.ISINF] if dtype.is_float else INT_UNARY
    binary = (FLOAT_BINARY if dtype.is_float else INT_BINARY) + COMPARE
    if dtype.is_float:
        pass
    elif not dtype.is_signed:
        binary = binary + [F.SHL, F.SHR]
    for fn in unary + binary:
        result = DType.BOOL if fn in COMPARE or fn in (F.ISNAN, F.ISINF) else dtype
        out = param(f"{fn.name.lower()}_out", result, (N,))
        args = (x,) if fn in unary else (x, y)
        body.append(elementwise(out, lambda idx, fn=fn, args=args, result=result: Call(fn, tuple(load(a, idx) for a in args), result)))
        outs.append(out)
        if fn in INEXACT and dtype.is_float:
            rtol[out.name] = ULPS[dtype]
    if dtype.is_float:  # max and min against a constant, either side (their C takes one compare)
        for fn in (F.MAX, F.MIN):
            for k, c in enumerate((0.0, -0.0, 6.0, np.inf, -np.inf)):
                for first in (False, True):
                    out = param(f"{fn.name.lower()}_const{k}_{'first' if first else 'second'}", dtype, (N,))

                    def value(idx, fn=fn, c=c, first=first):
                        a, b = load(x, idx), Const(c, dtype)
                        return Call(fn, (b, a) if first else (a, b), dtype)
                    body.append(elementwise(out, value))
                    outs.append(out)
    p = program(f"scalars_{dtype}", [x, y], outs, body)
    if dtype.is_float:
        return p, [_array(FLOAT_X, dtype), _array(FLOAT_Y, dtype)], rtol
    ys = [v % 8 for v in INT_Y] if not dtype.is_signed else INT_Y  # shifts stay below the width
    return p, [_array(INT_X, dtype), _array(ys, dtype)], rtol


def _int_pow_program():
    x, y = param("x", DType.INT32, (8,)), param("y", DType.INT32, (8,))
    out = param("pow_out", DType.INT32, (8,))
    p = program("int_pow", [x, y], [out], [elementwise(out, lambda i: Call(F.POW, (load(x, i), load(y, i)), DType.INT32))])
    return p, [np.array([2, -3, 5, 0, 1, -1, 7, 46341], np.int32), np.array([10, 3, 0, 4, 9, 5, 11, 2], np.int32)], {}


def _cast_program():
    """Every source dtype to every target dtype, on values every pair can hold."""
    ins, outs, body, arrays = [], [], [], []
    for src in CAST_DTYPES:
        values = [0, 1, 2.5, 3.7, 100.2, -0.0, 7.9, 120.6, 5.5, 0.49] if src.is_float else [0, 1, 5, 100, 127, 3, 64, 99, 2, 1]
        if src is DType.BOOL:
            values = [0, 1, 1, 0, 1, 0, 0, 1, 1, 1]
        x = param(f"x_{src}", src, (10,))
        ins.append(x)
        arrays.append(_array(values, src))
        for dst in CAST_DTYPES:
            out = param(f"{src}_to_{dst}", dst, (10,))
            outs.append(out)
            body.append(elementwise(out, lambda i, x=x, dst=dst: Call(F.CAST, (load(x, i),), dst)))
    for src in (DType.INT32, DType.INT64, DType.INT8):  # negative ints wrap into narrower and unsigned types
        x = param(f"neg_{src}", src, (6,))
        ins.append(x)
        arrays.append(_array([-1, -100, -128, 300 if src is not DType.INT8 else 3, -7, 0], src))
        for dst in (DType.UINT8, DType.INT8, DType.FLOAT16, DType.BFLOAT16, DType.BOOL):
            out = param(f"neg_{src}_to_{dst}", dst, (6,))
            outs.append(out)
            body.append(elementwise(out, lambda i, x=x, dst=dst: Call(F.CAST, (load(x, i),), dst)))
    x = param("special", DType.FLOAT32, (8,))  # nan and inf between float types and to bool
    ins.append(x)
    arrays.append(np.array([np.nan, np.inf, -np.inf, -0.0, 65520.0, 1e-8, 3.0e38, -2.5], np.float32))
    for dst in (DType.FLOAT64, DType.FLOAT16, DType.BFLOAT16, DType.BOOL):
        out = param(f"special_to_{dst}", dst, (8,))
        outs.append(out)
        body.append(elementwise(out, lambda i, x=x, dst=dst: Call(F.CAST, (load(x, i),), dst)))
    return program("casts", ins, outs, body), arrays, {}


def _index_program():
    """Floor division and modulo of negative ints; a guarded load far out of range."""
    outs = [param(f"o{k}", DType.INT64, (20,)) for k in range(8)]
    v = lambda i: iop(IOp.SUB, i[0], 10)  # noqa: E731  (-10 .. 9)
    exprs = [
        lambda i: iop(IOp.FLOORDIV, v(i), 3), lambda i: iop(IOp.MOD, v(i), 3),
        lambda i: iop(IOp.FLOORDIV, v(i), -3), lambda i: iop(IOp.MOD, v(i), -3),
        lambda i: iop(IOp.MIN, v(i), 2), lambda i: iop(IOp.MAX, iop(IOp.MOD, i[0], 32), 4),
        lambda i: iop(IOp.FLOORDIV, i[0], iop(IOp.SUB, i[0], 5)),  # divisor 0 at i = 5
        lambda i: Call(F.WHERE, (iop(IOp.LT, v(i), 0), iop(IOp.ADD, v(i), 100), v(i)), DType.INT64),
    ]
    body = [elementwise(o, e) for o, e in zip(outs, exprs)]
    # x[i * 10**12] is out of range for every i but 0: it must only run when i < 1
    x, y = param("x", DType.FLOAT32, (4,)), param("y", DType.FLOAT32, (4,))
    g = param("guarded", DType.FLOAT32, (8, 4))
    far = lambda i: load(x, (iop(IOp.MUL, i[0], 10**12),))  # noqa: E731
    body.append(elementwise(g, lambda i: Call(F.WHERE, (iop(IOp.LT, i[0], 1), Call(F.MUL, (far(i), far(i)), DType.FLOAT32),
                                                         load(y, (i[1],))), DType.FLOAT32)))
    arrays = [np.arange(1, 5, dtype=np.float32), np.arange(10, 14, dtype=np.float32)]
    return program("index", [x, y], [*outs, g], body), arrays, {}


def _copy_program():
    """Regions with tails on both sides, unit dims, a reshaping copy and a dtype change."""
    src = param("src", DType.FLOAT32, (5, 7))
    dst = param("dst", DType.FLOAT16, (2, 1, 4, 8))
    flat = param("flat", DType.INT32, (2, 4))
    t = Var("t")
    body = [
        Loop(t, 2, LoopKind.SERIAL, (
            Copy(Region(src, (iop(IOp.ADD, t, 2), const_index(4)), (4, 8)),
                 Region(dst, (t, const_index(0), const_index(0), const_index(2)), (1, 1, 4, 8))),
        )),
        Copy(Region(src, (const_index(1), const_index(-1)), (1, 8)), Region(flat, (const_index(0), const_index(0)), (2, 4))),
    ]
    return program("copies", [src], [dst, flat], body), [np.arange(35, dtype=np.float32).reshape(5, 7) * 0.37], {}


def _gemm_program():
    a, b = param("a", DType.FLOAT32, (5, 3)), param("b", DType.FLOAT32, (3, 4))
    at, bt = param("at", DType.FLOAT32, (3, 5)), param("bt", DType.FLOAT32, (4, 3))
    a16, b16 = param("a16", DType.FLOAT16, (5, 3)), param("b16", DType.FLOAT16, (3, 4))
    c, ct, c16 = param("c", DType.FLOAT32, (5, 4)), param("ct", DType.FLOAT32, (5, 4)), param("c16", DType.FLOAT16, (5, 4))
    ci = param("ci", DType.INT32, (5, 4))
    ai, bi = Buffer("ai", DType.INT32, (5, 3), Scope.SHARED), Buffer("bi", DType.INT32, (3, 4), Scope.SHARED)
    body = [
        Fill(c, Const(1.0, DType.FLOAT32)), Gemm(a, b, c),
        Gemm(at, bt, ct, trans_a=True, trans_b=True),
        Fill(c16, Const(0.5, DType.FLOAT16)), Gemm(a16, b16, c16),
        elementwise(ai, lambda i: Call(F.CAST, (load(a, i),), DType.INT32)),
        elementwise(bi, lambda i: Call(F.CAST, (load(b, i),), DType.INT32)),
        Gemm(ai, bi, ci),
    ]
    rng = np.random.default_rng(0)
    arrays = [(rng.standard_normal(s) * 4).astype(np.float32) for s in ((5, 3), (3, 4), (3, 5), (4, 3))]
    arrays += [rng.standard_normal((5, 3)).astype(np.float16), rng.standard_normal((3, 4)).astype(np.float16)]
    rtol = {"c": 1e-6, "ct": 1e-6, "c16": 1e-3}
    return program("gemms", [a, b, at, bt, a16, b16], [c, ct, c16, ci], body, allocs=[ai, bi]), arrays, rtol


def _gemm_blocks_program():
    """fp32 products through the register-blocked core: full 6x16 and 8x8 blocks, row and
    column tails (13 x 27 = 2x6+1 rows, 16+8+3 columns; 13 = 8+5 columns with K = 300, more
    than one padded tail panel), one row, a product narrower than a vector, and one big
    enough to be split over threads (outside a tile grid)."""
    shapes = [(13, 5, 27), (1, 7, 8), (6, 4, 16), (8, 9, 8), (130, 70, 40), (19, 300, 13), (3, 2, 5)]
    ins, outs, body, arrays = [], [], [], []
    rng = np.random.default_rng(3)
    for n, (m, k, cols) in enumerate(shapes):
        a, b = param(f"a{n}", DType.FLOAT32, (m, k)), param(f"b{n}", DType.FLOAT32, (k, cols))
        c = param(f"c{n}", DType.FLOAT32, (m, cols))
        ins += [a, b]
        outs.append(c)
        body += [Fill(c, Const(0.25, DType.FLOAT32)), Gemm(a, b, c)]
        arrays += [rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, cols)).astype(np.float32)]
    return program("gemm_blocks", ins, outs, body), arrays, {f"c{n}": 1e-5 for n in range(len(shapes))}


def _reduce_program():
    x, x16 = param("x", DType.FLOAT32, (6, 5)), param("x16", DType.FLOAT16, (6, 5))
    xi = param("xi", DType.INT8, (6, 5))
    outs = [param("sum1", DType.FLOAT32, (6,)), param("max0", DType.FLOAT32, (5,)), param("acc1", DType.FLOAT32, (6,)),
            param("sum16", DType.FLOAT16, (6,)), param("min0_i8", DType.INT8, (5,)), param("sum_i8", DType.INT8, (6,))]
    body = [
        ReduceTile(x, outs[0], ReduceFn.SUM, 1), ReduceTile(x, outs[1], ReduceFn.MAX, 0),
        Fill(outs[2], Const(2.0, DType.FLOAT32)), ReduceTile(x, outs[2], ReduceFn.PROD, 1, clear=False),
        ReduceTile(x16, outs[3], ReduceFn.SUM, 1), ReduceTile(xi, outs[4], ReduceFn.MIN, 0),
        ReduceTile(xi, outs[5], ReduceFn.SUM, 1),
    ]
    rng = np.random.default_rng(1)
    x_np = rng.standard_normal((6, 5)).astype(np.float32)
    x_np[2, 3] = np.nan
    arrays = [x_np, rng.standard_normal((6, 5)).astype(np.float16), rng.integers(-128, 128, (6, 5)).astype(np.int8)]
    return program("reduces", [x, x16, xi], outs, body), arrays, {"sum1": 1e-6, "acc1": 1e-6, "sum16": 1e-3}


def _grid_program():
    """A 2x3 grid of tiles (OpenMP), a heap tile buffer, a big parallel nest, bfloat16."""
    out = param("out", DType.FLOAT32, (2, 3, 300))
    big = Buffer("big", DType.FLOAT32, (20000,), Scope.SHARED)  # 80 KB: on the heap
    bx, by = Var("bx"), Var("by")
    body = [
        parallel((20000,), lambda i: [Store(big, i, Call(F.CAST, (iop(IOp.ADD, i[0], iop(IOp.MUL, bx, 7)),), DType.FLOAT32))]),
        parallel((300,), lambda i: [Store(out, (bx, by, i[0]), Call(F.ADD, (
            load(big, (iop(IOp.MUL, i[0], 60),)), Call(F.CAST, (by,), DType.FLOAT32)), DType.FLOAT32))], "j"),
    ]
    tiles = program("grid", [], [out], body, allocs=[big], grid=(2, 3))
    a = param("a", DType.BFLOAT16, (256, 600))
    wide = param("wide", DType.BFLOAT16, (256, 600))
    nest = elementwise(wide, lambda i: Call(F.MUL, (Call(F.EXP, (load(a, i),), DType.BFLOAT16), load(a, i)), DType.BFLOAT16))
    arr = (np.random.default_rng(2).standard_normal((256, 600)) * 3).astype(ml_dtypes.bfloat16)
    return [(tiles, [], {}), (program("wide", [a], [wide], [nest]), [arr], {"wide": 8e-3})]


def _branch_program():
    """Tile-uniform branches on the block index (packed siblings' epilogues): tile bx writes
    its own output only, inside a loop nest and around a hoistable load."""
    x = param("x", DType.FLOAT32, (3, 40))
    outs = [param(f"y{k}", DType.FLOAT32, (40,)) for k in range(3)]
    bx = Var("bx")
    scale = Call(F.CAST, (iop(IOp.ADD, bx, 1),), DType.FLOAT32)  # differs per tile: a branch run by every
    body = [If(iop(IOp.EQ, bx, k), (elementwise(o, lambda i: Call(F.MUL, (load(x, (const_index(k), i[0])), scale),
                                                                  DType.FLOAT32)),))  # tile would show
            for k, o in enumerate(outs)]
    arr = np.random.default_rng(3).standard_normal((3, 40)).astype(np.float32)
    return program("branches", [x], outs, body, grid=(3,)), [arr], {}


def test_branches_run_only_in_their_tile(artifacts):
    p, arrays, _ = CASES["branches"]
    got, _ = run_both(p, artifacts["branches"], arrays)
    for k, y in enumerate(got):
        np.testing.assert_allclose(y, arrays[0][k] * (k + 1), rtol=1e-6)


CASES = {
    "branches": _branch_program(),
    **{f"scalars_{d}": _scalar_program(d) for d in (DType.FLOAT32, DType.FLOAT64, DType.FLOAT16, DType.BFLOAT16,
                                                     DType.INT8, DType.INT32, DType.INT64, DType.UINT8)},
    "int_pow": _int_pow_program(), "casts": _cast_program(), "index": _index_program(), "copies": _copy_program(),
    "gemms": _gemm_program(), "gemm_blocks": _gemm_blocks_program(), "reduces": _reduce_program(),
    **{p.name: (p, arrays, rtol) for p, arrays, rtol in _grid_program()},
}


@pytest.fixture(scope="module")
def artifacts():
    names = list(CASES)
    return dict(zip(names, build_all([CASES[n][0] for n in names])))


def test_max_and_min_by_a_constant_take_the_one_compare_forms():
    text = emit_program(CASES["scalars_float32"][0]).text
    assert all(f"{form}_f32(" in text for form in ("tf_maxk", "tf_mink", "tf_kmax", "tf_kmin")), text[-2000:]


@pytest.mark.parametrize("name", list(CASES))
def test_c_matches_the_interpreter(name, artifacts):
    p, arrays, rtol = CASES[name]
    with np.errstate(all="ignore"):
        got, want = run_both(p, artifacts[name], arrays)
    assert_same(p, got, want, rtol)
    for b, g, w in zip(p.params[p.num_inputs:], got, want):
        if "_const" in b.name:  # max / min by a constant: the same zero as the general form's
            np.testing.assert_array_equal(np.signbit(g), np.signbit(w), err_msg=b.name)
