"""Index simplification: reshape round trips collapse, and semantics never change."""
import itertools

import numpy as np

from tilefuse.tile_ir.ir import IOp, Var, const_index, iop
from tilefuse.tile_ir.lower.elements import delinearize, linearize, reshape_index
from tilefuse.tile_ir.printer import format_expr
from tilefuse.tile_ir.simplify import _Simplifier


def _eval(e, env):
    from tilefuse.tile_ir.interpret import _State

    st = _State({})
    st.env = {k: np.int64(v) for k, v in env.items()}
    return int(st.expr(e))


def test_reshape_round_trip_is_the_identity():
    i, j = Var("i"), Var("j")
    there = reshape_index((i, j), (4, 8), (32,))
    back = reshape_index(there, (32,), (4, 8))
    s = _Simplifier({"i": 4, "j": 8})
    assert [format_expr(s.expr(e)) for e in back] == ["i", "j"]


def test_split_and_merge_of_a_tile_row():
    bm, r = Var("bm"), Var("r")
    row = iop(IOp.ADD, iop(IOp.MUL, bm, 16), r)
    flat = linearize(delinearize(row, (2, 16)), (2, 16))
    s = _Simplifier({"bm": 2, "r": 16})
    assert format_expr(s.expr(flat)) == format_expr(s.expr(row))


def test_simplification_preserves_values_exhaustively():
    a, b = Var("a"), Var("b")
    exprs = [
        iop(IOp.MOD, iop(IOp.ADD, iop(IOp.MUL, a, 6), b), 3),
        iop(IOp.FLOORDIV, iop(IOp.ADD, iop(IOp.MUL, a, 6), b), 3),
        iop(IOp.FLOORDIV, iop(IOp.SUB, iop(IOp.MUL, a, 4), 1), 4),
        iop(IOp.MOD, iop(IOp.SUB, b, 2), 5),
        iop(IOp.ADD, iop(IOp.MUL, iop(IOp.FLOORDIV, b, 2), 2), iop(IOp.MOD, b, 2)),
        iop(IOp.MIN, iop(IOp.MAX, iop(IOp.SUB, b, 3), const_index(0)), const_index(2)),
    ]
    s = _Simplifier({"a": 5, "b": 6})
    for e in exprs:
        simple = s.expr(e)
        for x, y in itertools.product(range(5), range(6)):
            assert _eval(simple, {"a": x, "b": y}) == _eval(e, {"a": x, "b": y}), format_expr(e)
