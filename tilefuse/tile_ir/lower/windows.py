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

import itertools
import math
from typing import Callable

from tilefuse.ir.dtypes import DType
from tilefuse.ir.graph import Node, Value
from tilefuse.ir.prims import Reduce, ReduceFn, ScalarFn, WindowReduce
from tilefuse.partition.model import FusedGroup
from tilefuse.patterns import WindowsMatch
from tilefuse.target import CPU, Target
from tilefuse.tile_ir.ir import Buffer, Call, Const, Expr, IOp, Load, Scope, Stmt, Store, TileProgram, Var, const_index, iop
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


def _taps(r: Node, unchecked: frozenset[int] = frozenset()) -> tuple[tuple[int, ...], Source]:
    """The extents of a window (or of the reduced axes) and where each tap reads; a
    window's reads along its dims ``unchecked`` are not checked (the caller visits only
    the positions inside the input there, ``_runs``)."""
    op, x, out = r.op, r.inputs[0], r.outputs[0].type.shape
    shape = x.type.shape
    if isinstance(op, WindowReduce):
        k = len(op.kernel)
        lead = len(shape) - k
        guards = [window_needs_guard(out[lead + d], op.kernel[d], op.strides[d], op.dilations[d], op.pads[d],
                                     shape[lead + d]) for d in range(k)]
        guards = [g and d not in unchecked for d, g in enumerate(guards)]

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


def _runs(r: Node, d: int) -> list[tuple[int, int]]:
    """Per tap of a window's dim ``d``, the run [lo, hi) of output positions along it
    whose input position ``o * stride + t * dilation - pad`` is inside the input."""
    op: WindowReduce = r.op  # type: ignore[assignment]
    lead = r.inputs[0].type.rank - len(op.kernel)
    n, size = r.outputs[0].type.shape[lead + d], r.inputs[0].type.shape[lead + d]
    stride, dil, pad = op.strides[d], op.dilations[d], op.pads[d]
    runs = []
    for t in range(op.kernel[d]):
        lo = min(n, max(0, -(-(pad - t * dil) // stride)))
        hi = min(n, max(0, (size - 1 + pad - t * dil) // stride + 1))
        runs.append((lo, max(lo, hi)))
    return runs


def tile_shape(shape: tuple[int, ...], cap: int, cores: int, least: int, keep_last: bool = False) -> list[int]:
    """Tile edges over ``shape``: whole trailing dims up to ``cap`` elements (divisors, so
    no tile has a tail), then the largest edge halved (as a divisor) while the grid leaves
    some of ``cores`` idle and a tile keeps at least ``least`` elements; with
    ``keep_last``, any edge but the last (a host's window loops run along it)."""
    tiles, room = [1] * len(shape), cap
    for d in reversed(range(len(shape))):
        tiles[d] = divisor_tile(shape[d], max(1, room))
        room //= tiles[d]
        if tiles[d] < shape[d]:
            break
    halvable = range(len(tiles) - 1) if keep_last and len(tiles) > 1 else range(len(tiles))
    while math.prod(s // t for s, t in zip(shape, tiles)) < cores:
        d = max(halvable, key=lambda d: tiles[d])
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
    host_window = not target.device.max_block_threads and isinstance(r.op, WindowReduce)
    taps, source = _taps(r)
    least = target.gemm.min_tile
    if not target.device.max_block_threads:
        # on a host a tile's least work counts its taps too: a squeeze-excite's global
        # pool of 32 channels over 112 x 112 is 32 outputs of 12,544 terms, two tiles' worth
        least = max(1, least // math.prod(taps))
    tiles = tile_shape(out_shape, target.window.tile, target.device.cores, least, keep_last=host_window)
    grid_dims = [d for d, (s, t) in enumerate(zip(out_shape, tiles)) if s > t]
    block_vars = tuple(Var(f"b{d}") for d in grid_dims) or (Var("b0"),)
    grid = tuple(out_shape[d] // tiles[d] for d in grid_dims) or (1,)
    origin: list[Expr] = [const_index(0)] * len(out_shape)
    for d, bv in zip(grid_dims, block_vars):
        origin[d] = iop(IOp.MUL, bv, tiles[d])
    inner = [d for d, t in enumerate(tiles) if t > 1]  # the tile's own loops; unit edges are the origin
    acc = Buffer("acc", dt, tuple(tiles[d] for d in inner) or (1,), Scope.FRAGMENT)
    wide = [d for d, t in enumerate(taps) if t > 1]
    x_rank = r.inputs[0].type.rank

    # on a host, a reduction along the input's last axis folds it into the policy's lanes
    # (running values, one a vector lane), then those into the output: one running value
    # took a global pool over 112 x 112 one add's latency a term (370 us for 32 channels)
    # (the trailing reduced axes that are the input's last ones as one: a global pool over
    # 14 x 14 folds 196 terms in lanes, not 14-term rows in one running value)
    want = target.window.lanes  # (0 on devices with blocks)
    flat = 0
    if isinstance(r.op, Reduce):
        while flat < len(taps) and r.op.axes[len(taps) - 1 - flat] == x_rank - 1 - flat:
            flat += 1
    lanes = (want if want and flat and wide and wide[-1] >= len(taps) - flat
             and math.prod(taps[len(taps) - flat:]) >= want else 0)
    part = Buffer("part", dt, (*acc.shape, max(lanes, 1)), Scope.FRAGMENT)  # each element's lanes

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

    def element(i: Index, folds: bool = True) -> list[Stmt]:
        """One output element: its running value, its window's taps folded in (unless
        ``folds`` is off: a host's tile folds them tap by tap first), its stores."""
        at = i or (const_index(0),)
        here.append(at)
        o = _position(origin, inner, i)

        def tap(t: Index) -> list[Stmt]:
            full: list[Expr] = [const_index(0)] * len(taps)
            for d, v in zip(wide, t):
                full[d] = v
            src, inside = source(o, tuple(full))
            val = widen(el.at(x, src), dt)
            if inside is not None:
                val = Call(ScalarFn.WHERE, (inside, val, start), dt)
            return [Store(acc, at, Call(COMBINE[fn], (Load(acc, at), val), dt))]

        stores: list[Stmt] = [Store(out, fwd[id(v)](o), el.at(v, fwd[id(v)](o))) for v, out in zip(group.outputs, kp.outputs)]
        if not folds:
            return stores
        if lanes:
            return [*_fold_in_lanes(names, taps, wide, flat, lanes, part, at, start, fn, dt,
                                    lambda t: widen(el.at(x, source(o, t)[0]), dt)),
                    Store(acc, at, start),
                    *serial(names, [lanes], lambda li: [Store(acc, at, Call(COMBINE[fn], (Load(acc, at),
                                                                                          Load(part, (*at, *li))), dt))]),
                    *stores]
        return [Store(acc, at, start), *serial(names, [taps[d] for d in wide], tap), *stores]

    last = len(out_shape) - 1
    outermost = host_window and tiles[last] == out_shape[last] > 1 and last in inner
    if outermost:
        body = _taps_outermost(names, r, tiles, inner, origin, acc, start, el, dt)
        body += parallel(names, [tiles[d] for d in inner], lambda i: element(i, folds=False))
    else:
        body = parallel(names, [tiles[d] for d in inner], element)
    elems = math.prod(tiles)
    if isinstance(r.op, WindowReduce):
        what = f"{fn.value} of {'x'.join(map(str, taps))} windows, strides {r.op.strides}"
    else:
        what = f"{fn.value} over axes {r.op.axes} ({math.prod(taps)} terms)"  # type: ignore[attr-defined]
    notes = (f"window: {what}, tiles of {elems} outputs {tuple(tiles)}, grid {grid}"
             + (", taps outermost" if outermost else ""),)
    threads = min(target.window.max_threads, elems)
    schedule = WindowsSchedule(shape=tuple(out_shape), tile=tuple(tiles), taps=tuple(taps), threads=threads)
    if lanes:
        notes = (notes[0] + f", the last axis folded in {lanes} lanes",)
    program = TileProgram(name, tuple(kp.params), kp.num_inputs, grid, block_vars, threads,
                          (acc, part) if lanes else (acc,), tuple(body), notes, schedule=schedule)
    return program, tuple(kp.bindings)


def _fold_in_lanes(names: Names, taps: tuple[int, ...], wide: list[int], flat: int, lanes: int, part: Buffer, at: Index,
                   start: Const, fn: ReduceFn, dt: DType, value: Callable[[tuple[Expr, ...]], Expr]) -> list[Stmt]:
    """The terms of the element at ``at`` folded into its ``lanes`` running values in
    ``part``: the last ``flat`` taps as one axis (row-major), its term ``j`` into lane
    ``j % lanes`` (whole runs of lanes, then the rest), the other reduced axes outside;
    ``value(t)`` is the term at taps ``t``."""
    inner = taps[len(taps) - flat:]
    last = math.prod(inner)
    runs, rest = divmod(last, lanes)
    outer_dims = [d for d in wide if d < len(taps) - flat]
    outer = [taps[d] for d in outer_dims]

    def fold(t_outer: Index, first: Expr, count: int) -> tuple[Stmt, ...]:
        def one(li: Index) -> list[Stmt]:
            full: list[Expr] = [const_index(0)] * len(taps)
            for d, v in zip(outer_dims, t_outer):
                full[d] = v
            j = iop(IOp.ADD, first, li[0])
            for d in range(len(taps) - 1, len(taps) - flat - 1, -1):  # j's digits, last axis first
                full[d] = iop(IOp.MOD, j, taps[d]) if d > len(taps) - flat else j
                j = iop(IOp.FLOORDIV, j, taps[d])
            lane = (*at, li[0])
            return [Store(part, lane, Call(COMBINE[fn], (Load(part, lane), value(tuple(full))), dt))]
        return serial(names, [count], one)

    out: list[Stmt] = [*serial(names, [lanes], lambda li: [Store(part, (*at, li[0]), start)])]
    out += serial(names, [*outer, runs], lambda t: fold(t[:-1], iop(IOp.MUL, t[-1], lanes), lanes))
    if rest:
        out += serial(names, outer, lambda t: fold(t, const_index(runs * lanes), rest))
    return out


def _position(origin: list[Expr], inner: list[int], i: Index) -> tuple[Expr, ...]:
    """The output position of a tile element: the tile's origin plus the element's index
    along the tile's own loops ``inner``."""
    o = list(origin)
    for d, v in zip(inner, i):
        o[d] = iop(IOp.ADD, origin[d], v)
    return tuple(o)


def _taps_outermost(names: Names, r: Node, tiles: list[int], inner: list[int], origin: list[Expr], acc: Buffer,
                    start: Const, el: ElementBuilder, dt: DType) -> tuple[Stmt, ...]:
    """A host's tile, one tap at a time: every running value starts at the identity, then
    each tap (in the order the per-element fold takes them) folds into the tile's running
    values in one nest. Along each window dim the tile holds whole, the nest visits only
    the positions whose input is inside it (``_runs``: no test, and the innermost loop,
    along the last dim, vectorises); other dims keep their check. The caller's nest of
    the epilogue then stores each element. Each element's fold sees the same taps in the
    same order, less the padded ones, which are the reduction's identity."""
    op: WindowReduce = r.op  # type: ignore[assignment]
    lead = r.inputs[0].type.rank - len(op.kernel)
    out_shape = r.outputs[0].type.shape
    whole = frozenset(d for d in range(len(op.kernel))
                      if lead + d in inner and tiles[lead + d] == out_shape[lead + d])
    taps, source = _taps(r, whole)
    runs = {d: _runs(r, d) for d in whole}
    fn = op.fn
    x = r.inputs[0]
    shape = [tiles[d] for d in inner]

    def tile_at(i: Index) -> Index:
        return i or (const_index(0),)

    out: list[Stmt] = list(parallel(names, shape, lambda i: [Store(acc, tile_at(i), start)]))
    for tap in itertools.product(*(range(t) for t in taps)):
        # per loop of the tile: the first position it visits and how many
        spans = [runs[d - lead][tap[d - lead]] if d - lead in whole else (0, tiles[d]) for d in inner]
        if any(hi <= lo for lo, hi in spans):
            continue

        def fold(i: Index, tap: tuple[int, ...] = tap, spans: list[tuple[int, int]] = spans) -> list[Stmt]:
            i = tuple(iop(IOp.ADD, v, lo) if lo else v for v, (lo, _) in zip(i, spans))
            src, inside = source(_position(origin, inner, i), tuple(const_index(t) for t in tap))
            val = widen(el.at(x, src), dt)
            if inside is not None:
                val = Call(ScalarFn.WHERE, (inside, val, start), dt)
            at = tile_at(i)
            return [Store(acc, at, Call(COMBINE[fn], (Load(acc, at), val), dt))]

        out += parallel(names, [hi - lo for lo, hi in spans], fold)
    return tuple(out)
