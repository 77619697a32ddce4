"""Small hand-made TilePrograms for the CPU code generator tests, and a checker that runs
one both in C and in the tile interpreter (the oracle)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from tilefuse.codegen.artifact import KernelArtifact
from tilefuse.codegen.cpu.call import call_kernel
from tilefuse.ir.dtypes import DType
from tilefuse.tile_ir.interpret import run_program
from tilefuse.tile_ir.ir import Buffer, Expr, Load, Loop, LoopKind, Scope, Stmt, Store, TileProgram, Var


def param(name: str, dtype: DType, shape: tuple[int, ...]) -> Buffer:
    return Buffer(name, dtype, shape, Scope.GLOBAL)


def program(name: str, inputs: Sequence[Buffer], outputs: Sequence[Buffer], body: Sequence[Stmt],
            allocs: Sequence[Buffer] = (), grid: tuple[int, ...] = (1,), notes: tuple[str, ...] = ()) -> TileProgram:
    block_vars = tuple(Var(n) for n in ("bx", "by", "bz")[: len(grid)])
    return TileProgram(name, (*inputs, *outputs), len(inputs), grid, block_vars, 1, tuple(allocs), tuple(body), notes)


def parallel(shape: Sequence[int], body_of, prefix: str = "i", kind: LoopKind = LoopKind.PARALLEL) -> Stmt:
    """A loop nest over ``shape``; ``body_of(vars)`` returns the innermost statements."""
    vars_ = [Var(f"{prefix}{k}") for k in range(len(shape))]
    body: tuple[Stmt, ...] = tuple(body_of(tuple(vars_)))
    for v, n in reversed(list(zip(vars_, shape))):
        body = (Loop(v, n, kind, body),)
    return body[0]


def elementwise(out: Buffer, value_of) -> Stmt:
    """``out[idx] = value_of(idx)`` over all of ``out``."""
    return parallel(out.shape, lambda idx: [Store(out, idx, value_of(idx))])


def load(b: Buffer, idx: Sequence[Expr]) -> Load:
    return Load(b, tuple(idx))


def run_both(p: TileProgram, artifact: KernelArtifact, inputs: Sequence[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(C outputs, interpreter outputs) of ``p`` on ``inputs``; outputs start zeroed."""
    outs = p.params[p.num_inputs:]
    got = [np.zeros(b.shape, b.dtype.numpy) for b in outs]
    want = [np.zeros(b.shape, b.dtype.numpy) for b in outs]
    ins = [np.ascontiguousarray(a) for a in inputs]
    call_kernel(artifact, ins + got)
    run_program(p, [a.copy() for a in ins] + want)
    return got, want


def assert_same(p: TileProgram, got: Sequence[np.ndarray], want: Sequence[np.ndarray], rtol: dict[str, float] | None = None) -> None:
    """Equal outputs (NaN where NaN); ``rtol`` per output name allows rounding slack."""
    for b, g, w in zip(p.params[p.num_inputs:], got, want):
        tol = (rtol or {}).get(b.name, 0.0)
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        if tol:
            np.testing.assert_allclose(g64, w64, rtol=tol, atol=tol, equal_nan=True, err_msg=f"{p.name}: {b.name}")
        else:
            np.testing.assert_array_equal(g64, w64, err_msg=f"{p.name}: {b.name}")
