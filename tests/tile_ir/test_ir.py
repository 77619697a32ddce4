"""Tile IR basics: a hand-written program, the verifier, the printer, the interpreter."""
import numpy as np
import pytest

from tilefuse.errors import GraphError
from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ReduceFn, ScalarFn
from tilefuse.target import CUDA_SM90A
from tilefuse.tile_ir import format_program, run_program, verify_program
from tilefuse.tile_ir.interpret import TileInterpreterError
from tilefuse.tile_ir.ir import (
    Buffer, Call, Const, Copy, Fill, Gemm, IOp, Load, Loop, LoopKind, ReduceTile, Region, Scope, Store, TileProgram,
    Var, const_index, iop,
)

F32 = DType.FLOAT32


def _gemm_relu_rowsum():
    """C = relu(A @ B) per 4x8 tile of a 8x16 output, plus row sums of C."""
    a = Buffer("a", F32, (8, 32), Scope.GLOBAL)
    b = Buffer("b", F32, (32, 16), Scope.GLOBAL)
    c = Buffer("c", F32, (8, 16), Scope.GLOBAL)
    ta = Buffer("ta", F32, (4, 32), Scope.SHARED)
    tb = Buffer("tb", F32, (32, 8), Scope.SHARED)
    acc = Buffer("acc", F32, (4, 8), Scope.FRAGMENT)
    bx, by, i, j = Var("bx"), Var("by"), Var("i"), Var("j")
    body = (
        Copy(Region(a, (iop(IOp.MUL, bx, 4), const_index(0)), (4, 32)), Region(ta, (const_index(0), const_index(0)), (4, 32))),
        Copy(Region(b, (const_index(0), iop(IOp.MUL, by, 8)), (32, 8)), Region(tb, (const_index(0), const_index(0)), (32, 8))),
        Fill(acc, Const(0.0, F32)),
        Gemm(ta, tb, acc),
        Loop(i, 4, LoopKind.PARALLEL, (Loop(j, 8, LoopKind.PARALLEL, (
            Store(c, (iop(IOp.ADD, iop(IOp.MUL, bx, 4), i), iop(IOp.ADD, iop(IOp.MUL, by, 8), j)),
                  Call(ScalarFn.MAX, (Load(acc, (i, j)), Const(0.0, F32)), F32)),
        )),)),
    )
    return TileProgram("gemm_relu", (a, b, c), 2, (2, 2), (bx, by), 128, (ta, tb, acc), body)


def test_hand_written_program_runs_like_numpy():
    p = _gemm_relu_rowsum()
    verify_program(p, CUDA_SM90A)
    rng = np.random.default_rng()
    a, b = rng.standard_normal((8, 32)).astype(np.float32), rng.standard_normal((32, 16)).astype(np.float32)
    c = np.zeros((8, 16), np.float32)
    run_program(p, [a, b, c])
    np.testing.assert_allclose(c, np.maximum(a @ b, 0), rtol=1e-5, atol=1e-5)


def test_printer_reads_like_tilelang():
    text = format_program(_gemm_relu_rowsum())
    assert "with T.Kernel(2, 2, threads=128) as (bx, by):" in text
    assert "T.alloc_fragment([4, 8], float32)" in text and "T.gemm(ta, tb, acc" in text
    assert "for i in T.Parallel(4):" in text


def test_verifier_catches_shape_and_binding_errors():
    p = _gemm_relu_rowsum()
    bad_gemm = TileProgram(p.name, p.params, 2, p.grid, p.block_vars, 1, p.allocs,
                           (Gemm(p.allocs[1], p.allocs[0], p.allocs[2]),))
    with pytest.raises(GraphError, match="do not fit"):
        verify_program(bad_gemm)
    unbound = TileProgram(p.name, p.params, 2, p.grid, p.block_vars, 1, p.allocs,
                          (Store(p.allocs[2], (Var("zz"), const_index(0)), Const(0.0, F32)),))
    with pytest.raises(GraphError, match="unbound variable zz"):
        verify_program(unbound)
    huge = Buffer("huge", F32, (1024, 1024), Scope.SHARED)
    too_big = TileProgram(p.name, p.params, 2, p.grid, p.block_vars, 1, (*p.allocs, huge), p.body)
    with pytest.raises(GraphError, match="tile buffers"):
        verify_program(too_big, CUDA_SM90A)


def test_out_of_range_load_is_an_error_unless_guarded():
    x = Buffer("x", F32, (4,), Scope.GLOBAL)
    y = Buffer("y", F32, (6,), Scope.GLOBAL)
    i = Var("i")
    raw = Store(y, (i,), Load(x, (iop(IOp.SUB, i, 1),)))
    with pytest.raises(TileInterpreterError, match="out of range"):
        run_program(TileProgram("p", (x, y), 1, (1,), (Var("bx"),), 1, (), (Loop(i, 6, LoopKind.PARALLEL, (raw,)),)),
                     [np.ones(4, np.float32), np.zeros(6, np.float32)])
    inside = iop(IOp.AND, iop(IOp.GE, iop(IOp.SUB, i, 1), 0), iop(IOp.LT, iop(IOp.SUB, i, 1), 4))
    guarded = Store(y, (i,), Call(ScalarFn.WHERE, (inside, Load(x, (iop(IOp.SUB, i, 1),)), Const(0.0, F32)), F32))
    out = np.zeros(6, np.float32)
    run_program(TileProgram("p", (x, y), 1, (1,), (Var("bx"),), 1, (), (Loop(i, 6, LoopKind.PARALLEL, (guarded,)),)),
                [np.arange(4, dtype=np.float32), out])
    assert out.tolist() == [0, 0, 1, 2, 3, 0]


def test_reduce_tile_running():
    s = Buffer("s", F32, (2, 3), Scope.GLOBAL)
    r = Buffer("r", F32, (2,), Scope.GLOBAL)
    t = Buffer("t", F32, (2, 3), Scope.SHARED)
    prog = TileProgram("red", (s, r), 1, (1,), (Var("bx"),), 1, (t,), (
        Copy(Region(s, (const_index(0), const_index(0)), (2, 3)), Region(t, (const_index(0), const_index(0)), (2, 3))),
        ReduceTile(t, r, ReduceFn.MAX, 1, clear=True),
    ))
    x = np.array([[1, 5, 2], [7, 0, 3]], np.float32)
    out = np.zeros(2, np.float32)
    run_program(prog, [x, out])
    assert out.tolist() == [5, 7]


def test_if_takes_a_bool_uniform_condition():
    """If: the verifier wants a bool condition; the interpreter refuses one that differs
    between a tile's threads (a parallel loop's variable); the printer shows it."""
    import numpy as np
    import pytest

    from tilefuse.errors import GraphError
    from tilefuse.ir.dtypes import DType
    from tilefuse.tile_ir.interpret import TileInterpreterError
    from tilefuse.ir.prims import ScalarFn
    from tilefuse.tile_ir.ir import Buffer, Call, If, IOp, Loop, LoopKind, Scope, Store, TileProgram, Var, iop
    from tilefuse.tile_ir.printer import format_program
    from tilefuse.tile_ir.verify import verify_program

    out = Buffer("out", DType.FLOAT32, (4,), Scope.GLOBAL)
    bx, i = Var("bx"), Var("i")
    tile = Call(ScalarFn.CAST, (iop(IOp.ADD, bx, 1),), DType.FLOAT32)  # 1 in tile 0, 2 in tile 1

    def prog(cond, inside_loop=False):
        store = Store(out, (i,), tile)
        body = (Loop(i, 4, LoopKind.PARALLEL, (If(cond, (store,)),)),) if inside_loop else \
            (If(cond, (Loop(i, 4, LoopKind.PARALLEL, (store,)),)),)
        return TileProgram("p", (out,), 0, (2,), (bx,), 1, (), body)

    good = prog(iop(IOp.EQ, bx, 0))
    verify_program(good)
    assert "if (bx == 0):" in format_program(good)
    with pytest.raises(GraphError, match="must be bool"):
        verify_program(prog(iop(IOp.ADD, bx, 1)))
    from tilefuse.tile_ir.interpret import run_program

    a = np.zeros(4, np.float32)
    run_program(good, [a])
    assert a.tolist() == [1.0] * 4  # only tile 0 wrote (tile 1, run after it, would write 2)
    with pytest.raises(TileInterpreterError, match="not uniform"):
        run_program(prog(iop(IOp.LT, i, 2), inside_loop=True), [np.zeros(4, np.float32)])
