"""Reduction lanes: how many of a block's threads share one reduction.

Two statements reduce along an axis on a GPU block without TileLang's register forms:

- a ReduceTile that placement leaves in shared memory (``registers`` False: tiles that are
  not powers of two, products), and
- a parallel nest whose every index folds one serial loop into its own element,
  ``b[i] = init; for j: b[i] = f(b[i], term)`` with f associative and commutative (sum,
  product, max, min): the row stage of a whole-row epilogue (a norm after a product).

One thread per kept index leaves most of the block idle when few indices are kept (64 rows
of a 256-thread block), so each kept index gets ``lanes`` threads: every lane folds the
terms ``j = jj * lanes + lane`` (neighbouring lanes read neighbouring elements) into a
register and writes its partial to shared memory, and one thread per kept index folds the
partials. Lanes are the largest power of two up to ``most`` (CudaOptions.reduction_lanes:
one thread folds the partials, so more lanes would make that fold the long pole) that
divides the reduced extent and, times the kept extent, fits in the block.

The answer is written on the statement (``ReduceTile.lanes``; ``Loop.lanes`` of the
fold's serial loop), 1 where one thread per index stays; the CUDA printer prints the
cooperative form where it is above 1, and the verifier (``check_lanes``) refuses lanes
where that form does not apply.

On a device without blocks the lanes of a tile reduction along its rows (``dim`` 1, a
float sum, max or min) are vector lanes of one thread: each row folds into ``lanes``
running values, element ``q`` into value ``q % lanes``, combined in order at the row's
end (the C printer); one running value would be a chain of dependent operations, a
four-cycle add each (ViT's 208 scores a row, twice a key step). Lanes are the largest
power of two up to ``most`` (CpuOptions.reduction_lanes) dividing the row with two
values a lane at least, and 4 at least (fewer: one running value). Sums change order so (within float32's rounding, as onnxruntime's do).
"""
from __future__ import annotations

import math
from dataclasses import replace

from tilefuse.device import Device
from tilefuse.errors import GraphError
from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ReduceFn, ScalarFn
from tilefuse.tile_ir.ir import Call, Expr, If, Load, Loop, LoopKind, ReduceTile, Stmt, Store, TileProgram, statements
from tilefuse.tile_ir.nests import accumulation, parallel_nest, reads

# the updates a fold may split over lanes: associative and commutative
FOLDS = frozenset({ScalarFn.ADD, ScalarFn.MUL, ScalarFn.MAX, ScalarFn.MIN})
# a host's tile reductions in vector lanes
_HOST_FOLDS = frozenset({ReduceFn.SUM, ReduceFn.MAX, ReduceFn.MIN})


def assign_lanes(program: TileProgram, device: Device, most: int = 32) -> TileProgram:
    """``program`` with the lanes of each reduction set for its block (devices with blocks
    only); ``most``: the code generator's ``reduction_lanes``."""
    if program.row_lanes:  # whole warps fold a row program's rows
        return program
    body = _assign(program.body, program.threads, most) if device.max_block_threads else _host(program.body, most)
    return program if body == program.body else replace(program, body=body)


def host_lanes(s: ReduceTile, most: int) -> int:
    """The vector lanes of a host's tile reduction (1: one running value)."""
    if s.dim != 1 or not s.src.dtype.is_float or s.fn not in _HOST_FOLDS:
        return 1
    lanes, reduced = 1, s.src.shape[1]
    while lanes < most and reduced % (lanes * 2) == 0 and reduced >= lanes * 4:
        lanes *= 2
    return lanes if lanes >= 4 else 1


def _host(stmts: tuple[Stmt, ...], most: int) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    for s in stmts:
        if isinstance(s, (Loop, If)):
            out.append(replace(s, body=_host(s.body, most)))
        elif isinstance(s, ReduceTile):
            lanes = host_lanes(s, most)
            out.append(s if s.lanes == lanes else replace(s, lanes=lanes))
        else:
            out.append(s)
    return tuple(out)


def lanes_for(kept: int, reduced: int, threads: int, most: int) -> int:
    """The largest power of two up to ``most`` that divides ``reduced`` and, times
    ``kept``, fits in ``threads`` (1: one thread per kept index)."""
    lanes = 1
    while lanes < most and reduced % (lanes * 2) == 0 and kept * lanes * 2 <= threads:
        lanes *= 2
    return lanes


def fold_of(update: Store, dtype: DType) -> tuple[ScalarFn, Expr] | None:
    """``b[i] = f(b[i], term)`` with f in FOLDS (max and min on floats only): (f, term);
    None for any other update (those keep one thread per index)."""
    v = update.value
    if not isinstance(v, Call) or v.fn not in FOLDS or len(v.args) != 2:
        return None
    if v.fn in (ScalarFn.MAX, ScalarFn.MIN) and not dtype.is_float:
        return None
    acc = Load(update.buffer, update.indices)
    a, b = v.args
    term = b if a == acc else a if b == acc else None
    if term is None or reads(term, update.buffer):
        return None
    return v.fn, term


def lane_fold(nest: list[Loop]) -> tuple[Store, Loop, ScalarFn, Expr] | None:
    """The nest's body as a fold of one serial loop that lanes may share (nothing after
    it): (init, the loop, the fold's function, its term), or None."""
    acc = accumulation(nest[-1].body)
    if acc is None:
        return None
    init, inner, update, after = acc
    fold = fold_of(update, init.buffer.dtype)
    if after or inner.body[0] is not update or fold is None:
        return None
    return init, inner, *fold


def _assign(stmts: tuple[Stmt, ...], threads: int, most: int) -> tuple[Stmt, ...]:
    out: list[Stmt] = []
    for s in stmts:
        if isinstance(s, Loop) and s.kind is LoopKind.PARALLEL:
            out.append(_nest(s, threads, most))
        elif isinstance(s, (Loop, If)):
            out.append(replace(s, body=_assign(s.body, threads, most)))
        elif isinstance(s, ReduceTile):
            kept, reduced = s.src.shape[1 - s.dim], s.src.shape[s.dim]
            lanes = 1 if s.registers else lanes_for(kept, reduced, threads, most)
            out.append(s if s.lanes == lanes else replace(s, lanes=lanes))
        else:
            out.append(s)
    return tuple(out)


def _nest(s: Loop, threads: int, most: int) -> Loop:
    """A parallel nest with its fold's lanes set, or its body's reductions (a nest holding
    anything but a running reduction is printed statement by statement)."""
    nest = parallel_nest(s)
    fold = lane_fold(nest)
    if fold is not None:
        init, inner = fold[:2]
        lanes = lanes_for(math.prod(l.extent for l in nest), inner.extent, threads, most)
        body: tuple[Stmt, ...] = (init, replace(inner, lanes=lanes))
    elif accumulation(nest[-1].body) is not None:  # a fold that keeps one thread per index
        return s
    else:
        body = _assign(nest[-1].body, threads, most)
    loop = replace(nest[-1], body=body)
    for outer in reversed(nest[:-1]):
        loop = replace(outer, body=(loop,))
    return loop


def check_lanes(p: TileProgram, blocks: bool) -> None:
    """Raise GraphError where lanes are set that the printers cannot honour: on a device
    without blocks; on a loop that is not the serial loop of a fold lanes may share; on a
    register reduction; lanes that are not a power of two dividing the reduced extent, or
    that with the kept extent do not fit in the block (the printer's nest of kept x lanes
    threads is one thread fitting never saw)."""
    shared: dict[int, int] = {}  # id of a fold's serial loop -> its nest's iterations (the outermost nest's)
    for nest in _nests(p.body):
        fold = lane_fold(nest)
        if fold is not None:
            shared.setdefault(id(fold[1]), math.prod(l.extent for l in nest))
    for s in statements(p.body):
        if isinstance(s, Loop) and s.lanes != 1:
            found = shared.get(id(s))  # an empty nest (rows of an empty tensor) keeps 0 iterations
            if found is None:
                raise GraphError(f"kernel {p.name}: loop {s.var.name} has {s.lanes} lanes but is no fold's serial loop")
            lanes, kept, reduced, where = s.lanes, found, s.extent, f"loop {s.var.name}"
        elif isinstance(s, ReduceTile) and s.lanes != 1:
            lanes, kept, reduced, where = s.lanes, s.src.shape[1 - s.dim], s.src.shape[s.dim], f"the reduction of {s.src.name}"
            if s.registers:
                raise GraphError(f"kernel {p.name}: {where} is a register reduction, yet has {lanes} lanes")
        else:
            continue
        if not blocks:
            if not isinstance(s, ReduceTile) or host_lanes(s, lanes) != lanes:
                raise GraphError(f"kernel {p.name}: {where} has {lanes} lanes on a device without blocks, "
                                 f"which folds only float row reductions of a tile in vector lanes dividing the row")
            continue
        if lanes < 1 or lanes & (lanes - 1) or reduced % lanes or kept * lanes > p.threads:
            raise GraphError(f"kernel {p.name}: {where} has {lanes} lanes: not a power of two dividing {reduced} "
                             f"whose {kept} x {lanes} threads fit in {p.threads}")


def _nests(stmts: tuple[Stmt, ...]) -> list[list[Loop]]:
    """Every parallel nest, inner ones included."""
    return [parallel_nest(s) for s in statements(stmts) if isinstance(s, Loop) and s.kind is LoopKind.PARALLEL]
