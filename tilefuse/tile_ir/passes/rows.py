"""Warp rows: row programs laid out as whole warps per row.

The row schedule (``tile_ir/lower/rows.py``) writes a norm or a softmax as tiles of ``br``
whole rows of ``E``: per reduction, a parallel nest fills a ``(br, E)`` tile that a
ReduceTile folds into a per-row buffer ``(br,)``; then parallel nests over ``(br, width)``
write the outputs, reading the per-row results at their own row. On a GPU block of
``threads`` where ``L = threads // br`` is whole warps, each row can get ``L`` lanes that
fold it in registers and warp shuffles, and the tile need never exist (the CUDA printer's
codegen/cuda/warp_rows.py). The pass decides it: ``TileProgram.row_lanes = L`` where the
program is of that shape (``row_plan``), 0 elsewhere:

- one grid dimension, every on-chip buffer a fragment: the row buffers ``(br,)`` and the
  tiles ``(br, width)``, each tile filled once, right before its reduction;
- each reduction a sum, max or min (warp shuffles have them) in float32 or float64, along
  the rows of the whole tile it follows, filled element (i, j) at (i, j);
- every nest reads on-chip buffers only as reduced row buffers at its own row, and writes
  a tile or a global output of width 1 or a multiple of ``L`` (no tail);
- at least one reduction, and a block not narrowed by thread fitting (its tile was sized
  for the threads asked).

The verifier checks a program's ``row_lanes`` with ``row_plan`` and the device's warp.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from tilefuse.device import Device
from tilefuse.errors import GraphError
from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ReduceFn
from tilefuse.tile_ir.ir import (Buffer, Load, Loop, LoopKind, ReduceTile, Scope, Stmt, Store, TileProgram, Var, statements,
                                 subexpressions)

# what a warp folds by shuffles (T.warp_reduce_*), in the types it folds them in
WARP_REDUCTIONS = frozenset({ReduceFn.SUM, ReduceFn.MAX, ReduceFn.MIN})
WARP_DTYPES = frozenset({DType.FLOAT32, DType.FLOAT64})


@dataclass(frozen=True)
class RowNest:
    """A parallel nest ``for i, j in (br, width): store``."""

    row: Var
    col: Var
    width: int
    store: Store


@dataclass(frozen=True)
class RowStep:
    nest: RowNest
    reduce: ReduceTile | None  # the fill's reduction; None: an output nest


@dataclass(frozen=True)
class RowPlan:
    """A row program as whole warps per row: ``rows`` (br) rows a tile, ``lanes`` (L)
    threads a row, its steps in order and its per-row buffers."""

    rows: int
    lanes: int
    steps: tuple[RowStep, ...]
    row_buffers: tuple[Buffer, ...]


def warp_rows(program: TileProgram, device: Device, enabled: bool = True) -> TileProgram:
    """``program`` with ``row_lanes`` set where it is a row program whose rows take whole
    warps (devices with warps only); ``enabled``: the code generator's ``warp_rows``."""
    lanes, br = 0, _tile_rows(program)
    if device.warp and enabled and not program.fitted_from and br and program.threads % br == 0:
        whole = (program.threads // br) % device.warp == 0
        if whole and row_plan(program, program.threads // br) is not None:
            lanes = program.threads // br
    return program if lanes == program.row_lanes else replace(program, row_lanes=lanes)


def row_plan(p: TileProgram, lanes: int) -> RowPlan | None:
    """``p`` as rows of ``lanes`` threads each (rows x lanes = its block), or None where it
    is not of that shape (see the module's list)."""
    br = _tile_rows(p)
    if len(p.grid) != 1 or not br or lanes < 1 or any(b.scope is not Scope.FRAGMENT for b in p.allocs):
        return None
    row_bufs = tuple(b for b in p.allocs if b.shape == (br,))
    tiles = {b for b in p.allocs if len(b.shape) == 2 and b.shape[0] == br}
    if len(row_bufs) + len(tiles) != len(p.allocs) or br * lanes != p.threads:
        return None
    ready: set[Buffer] = set()  # row buffers reduced so far
    steps: list[RowStep] = []
    body = p.body
    k = 0
    while k < len(body):
        nest = _nest(body[k], br)
        if nest is None or not _own_rows(nest, ready, set(p.allocs)):
            return None
        st = nest.store
        if st.buffer in tiles:  # a fill: its reduction comes next
            red = body[k + 1] if k + 1 < len(body) else None
            if not isinstance(red, ReduceTile) or not _reduces(red, st, nest, lanes):
                return None
            if red.dst not in row_bufs or red.dst in ready:
                return None
            tiles.discard(st.buffer)  # filled once
            ready.add(red.dst)
            steps.append(RowStep(nest, red))
            k += 2
        elif st.buffer.scope is Scope.GLOBAL and (nest.width == 1 or nest.width % lanes == 0):
            steps.append(RowStep(nest, None))
            k += 1
        else:
            return None
    if not ready:
        return None
    return RowPlan(br, lanes, tuple(steps), row_bufs)


def check_rows(p: TileProgram, warp: int | None) -> None:
    """Raise GraphError where ``row_lanes`` is set on a program that is not rows of that
    many lanes (row_plan), lanes that are not whole warps of the device's ``warp`` (None:
    no device to ask), or a program whose statements also carry reduction lanes (the warp
    form folds every row itself)."""
    lanes = p.row_lanes
    if not lanes:
        return
    if row_plan(p, lanes) is None:
        raise GraphError(f"kernel {p.name}: {lanes} lanes a row, but it is no row program of {p.threads} threads in rows "
                         f"of {lanes} (tile_ir/passes/rows.py)")
    if warp is not None and (not warp or lanes % warp):
        raise GraphError(f"kernel {p.name}: {lanes} lanes a row are not whole warps of {warp}")
    if any(getattr(s, "lanes", 1) != 1 for s in statements(p.body)):
        raise GraphError(f"kernel {p.name}: a row program of whole warps has reductions with lanes of their own")


def _tile_rows(p: TileProgram) -> int:
    """The rows of a row program's tile (its first buffer's first extent); 0: none."""
    return p.allocs[0].shape[0] if p.allocs and p.allocs[0].shape else 0


def _nest(s: Stmt, br: int) -> RowNest | None:
    """``s`` as ``for i, j in T.Parallel(br, width): one store``."""
    if not (isinstance(s, Loop) and s.kind is LoopKind.PARALLEL and s.extent == br and len(s.body) == 1):
        return None
    inner = s.body[0]
    if not (isinstance(inner, Loop) and inner.kind is LoopKind.PARALLEL and len(inner.body) == 1):
        return None
    st = inner.body[0]
    return RowNest(s.var, inner.var, inner.extent, st) if isinstance(st, Store) else None


def _reduces(red: ReduceTile, fill: Store, nest: RowNest, lanes: int) -> bool:
    """``red`` folds the whole tile ``fill`` writes, element (i, j) at (i, j), along its
    rows, in a float type warps shuffle, with lanes that cover a row without a tail."""
    if red.src != fill.buffer or red.dim != 1 or not red.clear:
        return False
    width = fill.buffer.shape[1]
    return (red.fn in WARP_REDUCTIONS and red.dst.dtype in WARP_DTYPES and red.src.dtype is red.dst.dtype
            and fill.indices == (nest.row, nest.col) and nest.width == width and width % lanes == 0)


def _own_rows(nest: RowNest, ready: set[Buffer], on_chip: set[Buffer]) -> bool:
    """The nest reads on-chip buffers only as reduced row buffers at its own row."""
    st = nest.store
    for e in (st.value, *st.indices):
        for x in subexpressions(e):
            if isinstance(x, Load) and x.buffer in on_chip and (x.buffer not in ready or x.indices != (nest.row,)):
                return False
    return True
