"""The window schedule: pooling, tiled over its output, the input read in place.

A group without contractions whose one reduction is a WindowReduce (max, average and Lp
pooling, LRN) or a Reduce the row schedule does not take (a global pool: the spatial
axes of [N, C, H, W]) is computed as tiles of the reduction's output. Per tile, one
parallel nest runs over the tile's elements (one per thread on a GPU); each element

- folds its window's taps in a serial loop into a running value (a register): every tap
  reads the input through its element expression (the prologue: a ReLU, a cast, a pad)
  straight from global memory, a padded position reading as the reduction's identity;
- then writes every group output at that element from the running value (the epilogue:
  an average's reciprocal count, a cast, a residual add, a flatten).

Nothing is staged: the tile's running values are all it keeps on chip.

Which groups take it is the windows pattern's answer (``patterns/windows.py``: every
output reached from the reduction through Maps of its shape, Reshapes and Transposes, so
one reduction element stands behind each output element); this module tiles the match.
"""
from __future__ import annotations

import math
from typing import Callable

from tilefuse.ir.graph import Node, Value
from tilefuse.ir.prims import Reduce, ScalarFn, WindowReduce
from tilefuse.partition.model import FusedGroup
from tilefuse.patterns import WindowsMatch
from tilefuse.target import CPU, Target
from tilefuse.tile_ir.ir import Buffer, Call, Expr, IOp, Load, Scope, Stmt, Store, TileProgram, Var, const_index, iop
from tilefuse.tile_ir.lower.common import COMBINE, Names, accumulator_dtype, divisor_tile, identity, parallel, serial, widen
from tilefuse.tile_ir.lower.elements import ElementBuilder, Index, window_needs_guard, window_source
from tilefuse.tile_ir.lower.forward import Forward, forward_index
from tilefuse.tile_ir.lower.params import kernel_params
from tilefuse.tile_ir.schedule import WindowsSchedule

# output index, tap index -> the input index it reads, and the condition that it is inside
# the input (None: always)
Source = Callable[[Index, Index], "tuple[Index, Expr | None]"]


def lower_windows(group: FusedGroup, match: WindowsMatch, name: str,
                  target: Target = CPU) -> tuple[TileProgram, tuple[Value, ...]]:
    """The tiled program of ``match``'s reduction and the values bound to its params."""
    r = match.reduction
    return _build(group, r, forward_index(match.epilogue, [r]), name, target)


def _taps(r: Node) -> tuple[tuple[int, ...], Source]:
    """The extents of a window (or of the reduced axes) and where each tap reads."""
    op, x, out = r.op, r.inputs[0], r.outputs[0].type.shape
    shape = x.type.shape
    if isinstance(op, WindowReduce):
        k = len(op.kernel)
        lead = len(shape) - k
        guards = [window_needs_guard(out[lead + d], op.kernel[d], op.strides[d], op.dilations[d], op.pads[d],
                                     shape[lead + d]) for d in range(k)]

        def window(o: Index, t: Index) -> tuple[Index, Expr | None]:
            pos, inside = window_source(o[lead:], t, op.strides, op.dilations, op.pads, shape[lead:], guards)
            return (*o[:lead], *pos), inside

        return op.kernel, window
    assert isinstance(op, Reduce)
    kept = [a for a in range(len(shape)) if a not in op.axes]

    def reduced(o: Index, t: Index) -> tuple[Index, Expr | None]:
        src: list[Expr] = list(o) if op.keepdims else [const_index(0)] * len(shape)
        if not op.keepdims:
            for a, i in zip(kept, o):
                src[a] = i
        for a, i in zip(op.axes, t):
            src[a] = i
        return tuple(src), None

    return tuple(shape[a] for a in op.axes), reduced


def tile_shape(shape: tuple[int, ...], cap: int, cores: int, least: int) -> list[int]:
    """Tile edges over ``shape``: whole trailing dims up to ``cap`` elements (divisors, so
    no tile has a tail), then the largest edge halved (as a divisor) while the grid leaves
    some of ``cores`` idle and a tile keeps at least ``least`` elements."""
    tiles, room = [1] * len(shape), cap
    for d in reversed(range(len(shape))):
        tiles[d] = divisor_tile(shape[d], max(1, room))
        room //= tiles[d]
        if tiles[d] < shape[d]:
            break
    while math.prod(s // t for s, t in zip(shape, tiles)) < cores:
        d = max(range(len(tiles)), key=lambda d: tiles[d])
        smaller = divisor_tile(shape[d], tiles[d] // 2) if tiles[d] > 1 else 1
        if smaller == tiles[d] or math.prod(tiles) // tiles[d] * smaller < least:
            break
        tiles[d] = smaller
    return tiles


def _build(group: FusedGroup, r: Node, fwd: dict[int, Forward], name: str,
           target: Target) -> tuple[TileProgram, tuple[Value, ...]]:
    names = Names()
    y = r.outputs[0]
    out_shape = y.type.shape
    fn = r.op.fn  # type: ignore[attr-defined]
    dt = accumulator_dtype(y.type.dtype)
    tiles = tile_shape(out_shape, target.window.tile, target.device.cores, target.gemm.min_tile)
    grid_dims = [d for d, (s, t) in enumerate(zip(out_shape, tiles)) if s > t]
    block_vars = tuple(Var(f"b{d}") for d in grid_dims) or (Var("b0"),)
    grid = tuple(out_shape[d] // tiles[d] for d in grid_dims) or (1,)
    origin: list[Expr] = [const_index(0)] * len(out_shape)
    for d, bv in zip(grid_dims, block_vars):
        origin[d] = iop(IOp.MUL, bv, tiles[d])
    inner = [d for d, t in enumerate(tiles) if t > 1]  # the tile's own loops; unit edges are the origin
    acc = Buffer("acc", dt, tuple(tiles[d] for d in inner) or (1,), Scope.FRAGMENT)
    taps, source = _taps(r)
    wide = [d for d, t in enumerate(taps) if t > 1]

    kp = kernel_params(group)
    here: list[Index] = []  # the tile element being computed: where reads of y find it

    def read(v: Value, idx: Index) -> Expr:
        if v is not y:
            return Load(kp.buffers[id(v)], idx)
        load: Expr = Load(acc, here[0])
        return load if dt is v.type.dtype else Call(ScalarFn.CAST, (load,), v.type.dtype)

    kp.buffers[id(y)] = acc
    el = ElementBuilder(kp.buffers, read, kp.sites)
    x = r.inputs[0]
    start = identity(fn, dt)

    def element(i: Index) -> list[Stmt]:
        at = i or (const_index(0),)
        here.append(at)
        where = list(origin)
        for d, v in zip(inner, i):
            where[d] = iop(IOp.ADD, origin[d], v)
        o = tuple(where)

        def tap(t: Index) -> list[Stmt]:
            full: list[Expr] = [const_index(0)] * len(taps)
            for d, v in zip(wide, t):
                full[d] = v
            src, inside = source(o, tuple(full))
            val = widen(el.at(x, src), dt)
            if inside is not None:
                val = Call(ScalarFn.WHERE, (inside, val, start), dt)
            return [Store(acc, at, Call(COMBINE[fn], (Load(acc, at), val), dt))]

        stores = [Store(out, fwd[id(v)](o), el.at(v, fwd[id(v)](o))) for v, out in zip(group.outputs, kp.outputs)]
        return [Store(acc, at, start), *serial(names, [taps[d] for d in wide], tap), *stores]

    body = parallel(names, [tiles[d] for d in inner], element)
    elems = math.prod(tiles)
    if isinstance(r.op, WindowReduce):
        what = f"{fn.value} of {'x'.join(map(str, taps))} windows, strides {r.op.strides}"
    else:
        what = f"{fn.value} over axes {r.op.axes} ({math.prod(taps)} terms)"  # type: ignore[attr-defined]
    notes = (f"window: {what}, tiles of {elems} outputs {tuple(tiles)}, grid {grid}",)
    threads = min(target.window.max_threads, elems)
    schedule = WindowsSchedule(shape=tuple(out_shape), tile=tuple(tiles), taps=tuple(taps), threads=threads)
    program = TileProgram(name, tuple(kp.params), kp.num_inputs, grid, block_vars, threads, (acc,), tuple(body), notes,
                          schedule=schedule)
    return program, tuple(kp.bindings)
