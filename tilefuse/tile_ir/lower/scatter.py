"""The scatter schedule: blocks that own tiles of the output and the updates landing there.

Every update of a scatter may land anywhere, so a grid cannot copy the data and then
scatter without a barrier between the two that only a second launch gives. Instead each
block owns a tile of the output: it fills the tile from the data (in shared memory), applies
the updates that land in it, in the operator's order, and stores the tile. No two blocks
write one element, and one element's updates are applied by one thread in order, so
repeated indices and reductions give ONNX Runtime's sequential answer with no atomics.

- ScatterND: the output is ``rows x width``, rows the positions its index tuples name and
  width the elements one update writes. A tile is ``R x C`` of it; its block reads every
  update's index tuple (a uniform branch: all threads read the same one) and, for those
  in its rows, writes the update's ``C`` columns, one a thread. The cost is every block
  reading every index tuple: small next to the data for the usual few updates (a KV-cache
  write; tiles then shrink to fill the cores), while for many (single elements at a
  million index tuples) the blocks' scans dominate: a schedule that writes in place after
  a copy is the one for those, with in-place buffers in the plan.
- ScatterElements: the output is every other position x the scattered axis, a tile ``R``
  whole rows of it, updated step by step over the indices' extent on the axis. Where the
  steps are few (``ScatterPolicy.max_row_compares``), each element's own thread compares
  its position with its row's index and takes the update; else each row's thread writes
  its row's update where it lands. A block reads only its own rows' updates.

Indices are checked where they are read (``IndexCheck``: one out of range writes nothing
past the tile and fails the run, naming the node and the value).
"""
from __future__ import annotations

import math

from tilefuse.ir.graph import Node, Value
from tilefuse.ir.prims import ScalarFn, ScatterElements, ScatterND
from tilefuse.partition.model import FusedGroup
from tilefuse.patterns import ScatterMatch
from tilefuse.target import Target
from tilefuse.tile_ir.ir import (Buffer, Call, Expr, If, IOp, Load, Loop, LoopKind, Scope, Stmt, Store, TileProgram,
                                 Var, const_index, iop)
from tilefuse.tile_ir.lower.common import Names, accumulator_dtype, even_divisor, narrow, parallel, scatter_combine, widen
from tilefuse.tile_ir.lower.elements import ElementBuilder, Index, delinearize, index_position, linearize
from tilefuse.tile_ir.lower.params import KernelParams, kernel_params
from tilefuse.tile_ir.schedule import ScatterSchedule

def lower_scatter(group: FusedGroup, match: ScatterMatch, name: str,
                  target: Target) -> tuple[TileProgram, tuple[Value, ...]] | None:
    """The owner-tiled program of ``match``'s scatter, or None where one row of its tile
    does not fit the block's shared memory (ScatterElements over a very long axis)."""
    node = match.scatter
    kp = kernel_params(group)
    el = ElementBuilder(kp.buffers, None, kp.sites)
    if isinstance(node.op, ScatterND):
        return _scatter_nd(node, kp, el, name, target)
    return _scatter_elements(node, kp, el, name, target)


def _threads(nests: tuple[int, ...], most: int) -> int:
    """The most threads, up to ``most``, that split every nest at least as long evenly
    (63 for a tile of 4 x 63: odd widths need not fall to one thread)."""
    return max(d for d in range(1, min(most, max(nests)) + 1) if all(n < d or n % d == 0 for n in nests))


def _fill_cores(rows: int, width: int, tile_rows: int, cols: int, target: Target) -> tuple[int, int]:
    """Tiles halved (rows first, as even divisors) while the grid leaves cores idle and a
    tile keeps at least ``ScatterPolicy.min_tile_elems``: more blocks for a few updates."""
    policy, cores = target.scatter, target.device.cores
    while (rows // tile_rows) * (width // cols) < cores:
        if tile_rows > 1 and tile_rows // 2 * cols >= policy.min_tile_elems:
            tile_rows = even_divisor(rows, tile_rows // 2, cols, policy.threads)
        elif cols > 1 and cols // 2 * tile_rows >= policy.min_tile_elems:
            cols = even_divisor(width, cols // 2, tile_rows, policy.threads)
        else:
            break
    return tile_rows, cols


def _program(name: str, kp: KernelParams, grid: tuple[int, ...], block_vars: tuple[Var, ...], tile: Buffer,
             body: list[Stmt], schedule: ScatterSchedule, note: str) -> tuple[TileProgram, tuple[Value, ...]]:
    program = TileProgram(name, tuple(kp.params), kp.num_inputs, grid, block_vars, schedule.threads, (tile,),
                          tuple(body), (note,), schedule=schedule)
    return program, tuple(kp.bindings)


def _scatter_nd(node: Node, kp: KernelParams, el: ElementBuilder, name: str,
                target: Target) -> tuple[TileProgram, tuple[Value, ...]]:
    op: ScatterND = node.op  # type: ignore[assignment]
    data, ind, upd = node.inputs
    (out,) = kp.outputs
    shape = data.type.shape
    depth = ind.type.shape[-1]  # coordinates in one index tuple
    lead, tail = shape[:depth], shape[depth:]
    rows, width = math.prod(lead), math.prod(tail)
    updates = math.prod(ind.type.shape[:-1])
    policy, names = target.scatter, Names()
    cols = even_divisor(width, min(policy.max_cols, policy.tile_elems), 1, policy.threads)
    tile_rows = even_divisor(rows, max(1, policy.tile_elems // cols), cols, policy.threads)
    if updates <= policy.tile_elems:  # every block scans every update: more blocks only for a few
        tile_rows, cols = _fill_cores(rows, width, tile_rows, cols, target)
    acc = accumulator_dtype(out.dtype)
    tile = Buffer("tile", acc, (tile_rows, cols), Scope.SHARED)
    bx, by = Var("bx"), Var("by")
    r0, c0 = iop(IOp.MUL, bx, tile_rows), iop(IOp.MUL, by, cols)

    def at(r: Expr, c: Expr) -> Index:  # element (r, c) of the tile, in the output's shape
        return (*delinearize(iop(IOp.ADD, r0, r), lead), *delinearize(iop(IOp.ADD, c0, c), tail))

    body: list[Stmt] = list(parallel(names, (tile_rows, cols), lambda rc: [
        Store(tile, rc, widen(el.at(data, at(*rc)), acc))]))
    el.memo.clear()
    j = names.var("u")
    jidx = delinearize(j, ind.type.shape[:-1])
    coords = tuple(index_position(el.sites, node, q, el.at(ind, (*jidx, const_index(q))), ind.type.dtype, lead[q])
                   for q in range(depth))
    local = iop(IOp.SUB, linearize(coords, lead), r0)  # the update's row in the tile
    mine = iop(IOp.AND, iop(IOp.GE, local, 0), iop(IOp.LT, local, tile_rows))

    def apply(c: Index) -> list[Stmt]:
        where = (local, c[0])
        new = widen(el.at(upd, (*jidx, *delinearize(iop(IOp.ADD, c0, c[0]), tail))), acc)
        return [Store(tile, where, scatter_combine(op.reduction, Load(tile, where), new, acc))]

    body.append(Loop(j, updates, LoopKind.SERIAL, (If(mine, parallel(names, (cols,), apply)),)))
    el.memo.clear()
    body += parallel(names, (tile_rows, cols), lambda rc: [Store(out, at(*rc), narrow(Load(tile, rc), out.dtype))])
    grid = (rows // tile_rows, width // cols)
    threads = _threads((tile_rows * cols, cols), policy.threads)
    schedule = ScatterSchedule(form="nd", rows=rows, width=width, updates=updates, tile=(tile_rows, cols),
                               reduction=op.reduction.value, threads=threads)
    note = f"scatter: tiles of {tile_rows} x {cols} of {rows} x {width}, grid {grid}, each block reading {updates} updates"
    return _program(name, kp, grid, (bx, by), tile, body, schedule, note)


def _scatter_elements(node: Node, kp: KernelParams, el: ElementBuilder, name: str,
                      target: Target) -> tuple[TileProgram, tuple[Value, ...]] | None:
    op: ScatterElements = node.op  # type: ignore[assignment]
    data, ind, upd = node.inputs
    (out,) = kp.outputs
    shape, ishape, axis = data.type.shape, ind.type.shape, op.axis
    others = shape[:axis] + shape[axis + 1:]
    rows, width = math.prod(others), shape[axis]
    policy, names = target.scatter, Names()
    acc = accumulator_dtype(out.dtype)
    if width * acc.itemsize > target.device.onchip_bytes // 2:
        return None  # one row of the tile would not fit on chip
    tile_rows = even_divisor(rows, max(1, policy.tile_elems // width), width, policy.threads)
    tile_rows, _ = _fill_cores(rows, width, tile_rows, width, target)
    tile = Buffer("tile", acc, (tile_rows, width), Scope.SHARED)
    bx = Var("bx")
    r0 = iop(IOp.MUL, bx, tile_rows)

    def full(r: Expr, x: Expr, within: tuple[int, ...]) -> Index:
        """(row r of the tile, x on the axis) in a tensor of shape ``within``: coordinates
        past its end (the indices may be shorter than the data) clamped to its last."""
        o = delinearize(iop(IOp.ADD, r0, r), others)
        o = tuple(iop(IOp.MIN, e, w - 1) if w < d else e
                  for e, w, d in zip(o, within[:axis] + within[axis + 1:], others))
        return (*o[:axis], x, *o[axis:])

    body: list[Stmt] = list(parallel(names, (tile_rows, width), lambda rx: [
        Store(tile, rx, widen(el.at(data, full(rx[0], rx[1], shape)), acc))]))
    el.memo.clear()
    # the axes on which the indices reach fewer rows than the data has
    covered = [d for d in range(len(shape)) if d != axis and ishape[d] < shape[d]]

    k = names.var("k")
    steps = ishape[axis]
    per_element = steps * width <= policy.max_row_compares

    def inside(r: Expr) -> Expr | None:
        """Whether tile row ``r`` is one the indices reach (None: every row is)."""
        o = delinearize(iop(IOp.ADD, r0, r), others)
        cond: Expr | None = None
        for d in covered:
            c = iop(IOp.LT, o[d if d < axis else d - 1], ishape[d])
            cond = c if cond is None else iop(IOp.AND, cond, c)
        return cond

    def update(r: Expr) -> tuple[Expr, Expr]:  # (where row r's step-k update lands, its value)
        src = full(r, k, ishape)
        return index_position(el.sites, node, 0, el.at(ind, src), ind.type.dtype, width), widen(el.at(upd, src), acc)

    def each_element(rx: Index) -> list[Stmt]:  # the element's own thread takes the update landing on it
        pos, new = update(rx[0])
        hit = iop(IOp.EQ, rx[1], pos)
        row_ok = inside(rx[0])
        hit = hit if row_ok is None else iop(IOp.AND, row_ok, hit)
        old = Load(tile, rx)
        return [Store(tile, rx, Call(ScalarFn.WHERE, (hit, scatter_combine(op.reduction, old, new, acc), old), acc))]

    def each_row(r: Index) -> list[Stmt]:  # the row's thread writes its update where it lands
        pos, new = update(r[0])
        where = (r[0], pos)
        value = scatter_combine(op.reduction, Load(tile, where), new, acc)
        row_ok = inside(r[0])
        if row_ok is not None:
            value = Call(ScalarFn.WHERE, (row_ok, value, Load(tile, where)), acc)
        return [Store(tile, where, value)]

    # update after update (the operator's order), a barrier between two steps outside the
    # nest; each element written only by its own thread where a step compares every
    # element of the tile with its row's index (few steps), else by its row's thread
    nest = parallel(names, (tile_rows, width), each_element) if per_element else parallel(names, (tile_rows,), each_row)
    body.append(Loop(k, steps, LoopKind.SERIAL, nest))
    el.memo.clear()
    body += parallel(names, (tile_rows, width), lambda rx: [
        Store(out, full(rx[0], rx[1], shape), narrow(Load(tile, rx), out.dtype))])
    grid = (rows // tile_rows,)
    threads = _threads((tile_rows * width, tile_rows), policy.threads)
    schedule = ScatterSchedule(form="elements", rows=rows, width=width, updates=steps, tile=(tile_rows, width),
                               reduction=op.reduction.value, threads=threads, per_element=per_element)
    note = (f"scatter: tiles of {tile_rows} whole rows of {width}, grid {grid}, each row applying its {steps} updates"
            f" {'element by element' if per_element else 'on one thread'}")
    return _program(name, kp, grid, (bx,), tile, body, schedule, note)
