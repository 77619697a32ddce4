"""The TileProgram verifier: well-formed, well-typed, and within the target's limits."""
from __future__ import annotations

import math

from tilefuse import backends
from tilefuse.errors import GraphError
from tilefuse.ir.dtypes import DType
from tilefuse.target import Target
from tilefuse.tile_ir.nests import uneven_nests
from tilefuse.tile_ir.passes.epilogues import check_staging
from tilefuse.tile_ir.passes.lanes import check_lanes
from tilefuse.tile_ir.passes.pipelines import check_pipelines
from tilefuse.tile_ir.passes.placement import check_placement
from tilefuse.tile_ir.passes.rows import check_rows
from tilefuse.tile_ir.printer import format_expr
from tilefuse.tile_ir.ir import (
    Buffer,
    Call,
    Const,
    Copy,
    Expr,
    Fill,
    Gemm,
    If,
    IndexCheck,
    IndexOp,
    LaneTaps,
    PlaneTaps,
    Load,
    Loop,
    PanelGemm,
    ReduceTile,
    Region,
    Scope,
    Store,
    StridedGemm,
    TapGemm,
    TileProgram,
    Transpose,
    Var,
    Winograd,
    dtype_of,
    statements,
    transpose_dims,
    transpose_rows_are_runs,
)


def verify_program(p: TileProgram, target: Target | None = None) -> None:
    """Raise GraphError if a buffer is used that is not a param or alloc, a variable is
    unbound, an index count does not match a buffer's rank, a Gemm's tiles (or a panel
    product's operands) do not fit together, a schedule record disagrees with the program
    it describes (threads, occupancy, producer), a host order that is not one of the grid's axes, a reduction's lanes or a row program's lanes a row are not ones
    the printers can honour (passes/lanes.py, passes/rows.py), or (with a target) per-tile buffers exceed its on-chip budget."""
    known = {b.name: b for b in (*p.params, *p.allocs)}
    if len(known) != len(p.params) + len(p.allocs):
        raise GraphError(f"{p.name}: buffer names repeat")
    if any(b.scope is not Scope.GLOBAL for b in p.params) or any(b.scope is Scope.GLOBAL for b in p.allocs):
        raise GraphError(f"{p.name}: params must be global, allocs shared/fragment")
    if p.schedule is not None:
        _check_schedule(p)
    if p.host_order and sorted(p.host_order) != list(range(len(p.grid))):
        raise GraphError(f"{p.name}: host_order {p.host_order} is not an order of the grid's {len(p.grid)} axes")
    bound = {v.name for v in p.block_vars}
    for s in p.body:
        _check_stmt(p, s, known, bound)
    check_lanes(p, target is None or bool(target.device.max_block_threads))
    check_rows(p, None if target is None else target.device.warp)
    check_staging(p, target is None or bool(target.device.max_block_threads))
    check_pipelines(p, None if target is None else target.device)
    if target is not None and target.device.max_block_threads:
        _check_block(p, target.device.max_block_threads)
        if any(isinstance(x, (PanelGemm, StridedGemm, TapGemm, Transpose, LaneTaps, PlaneTaps, Winograd))
               for x in statements(p.body)):
            raise GraphError(f"kernel {p.name}: a panel, strided or tap product, a block transpose, lane or plane taps or a "
                             f"Winograd convolution run on the host's product core, not a {target.name} one")
    if target is not None and backends.for_target(target).tiles_on_chip:
        # an accumulator's shared mirror (passes/epilogues.py) holds the tile its registers
        # hold, counted once: the accumulator's
        mirrors = {x.dst.buffer for x in statements(p.body)
                   if isinstance(x, Copy) and x.bulk and x.src.buffer.scope is not Scope.GLOBAL}
        onchip = sum(math.prod(b.shape) * b.dtype.itemsize for b in p.allocs if b not in mirrors)
        if onchip > target.device.onchip_bytes:
            how = p.notes[0].split(":")[0] if p.notes else "its"
            raise GraphError(f"kernel {p.name}: the {how} schedule needs {onchip // 1024} KB of on-chip tile buffers, "
                             f"more than the {target.device.onchip_bytes // 1024} KB a {target.name} block has; this group has "
                             f"no schedule for {target.name} at this size yet")


def _check_schedule(p: TileProgram) -> None:
    """The record says what the program does: the same threads, and where the record has
    them, the same resident tiles and producer."""
    s = p.schedule
    assert s is not None
    said = {"threads": p.threads, "occupancy": p.occupancy, "producer": p.producer}
    for name, actual in said.items():
        recorded = getattr(s, name, actual)
        if recorded != actual:
            raise GraphError(f"{p.name}: its {s.family} schedule records {name}={recorded}, the program has {actual}")


def _check_block(p: TileProgram, most: int) -> None:
    """A block's threads are within the device's and split every parallel nest at least
    as long as the block evenly (the thread fitting pass makes it so; printers rely on it)."""
    if not 1 <= p.threads <= most:
        raise GraphError(f"kernel {p.name}: {p.threads} threads per block, the device allows 1 to {most}")
    uneven = uneven_nests(p.body, p.threads)
    if uneven:
        raise GraphError(f"kernel {p.name}: {p.threads} threads do not split its parallel nests of {uneven} "
                         f"iterations evenly (tile_ir.passes.fit_threads narrows them)")
    check_placement(p)
    if p.fitted_from and p.fitted_from < p.threads:
        raise GraphError(f"kernel {p.name}: fitted from {p.fitted_from} threads to more, {p.threads}")


def _whole(r: Region) -> bool:
    """``r`` is the whole of an on-chip buffer."""
    return (r.buffer.scope is not Scope.GLOBAL and r.extents == r.buffer.shape
            and all(isinstance(o, Const) and o.value == 0 for o in r.offsets))


def _check_buffer(p: TileProgram, b: Buffer, known: dict[str, Buffer]) -> None:
    if known.get(b.name) != b:
        raise GraphError(f"{p.name}: unknown buffer {b.name}")


def _check_expr(p: TileProgram, e: Expr, known: dict[str, Buffer], bound: set[str]) -> None:
    if isinstance(e, Var):
        if e.name not in bound:
            raise GraphError(f"{p.name}: unbound variable {e.name}")
    elif isinstance(e, IndexOp):
        _check_expr(p, e.a, known, bound)
        _check_expr(p, e.b, known, bound)
    elif isinstance(e, Load):
        _check_buffer(p, e.buffer, known)
        if len(e.indices) != len(e.buffer.shape):
            raise GraphError(f"{p.name}: {len(e.indices)} indices into {e.buffer.name} of rank {len(e.buffer.shape)}")
        for i in e.indices:
            _check_expr(p, i, known, bound)
    elif isinstance(e, Call):
        if len(e.args) != e.fn.arity:
            raise GraphError(f"{p.name}: {e.fn.name} takes {e.fn.arity} args")
        for a in e.args:
            _check_expr(p, a, known, bound)
    elif isinstance(e, IndexCheck):
        if not 0 <= e.site < p.index_sites or e.extent < 1:
            raise GraphError(f"{p.name}: index check {format_expr(e)} of {p.index_sites} sites")
        if dtype_of(e.index) is not DType.INT64:
            raise GraphError(f"{p.name}: a checked index must be int64, got {format_expr(e.index)}")
        _check_expr(p, e.index, known, bound)
    elif not isinstance(e, Const):
        raise GraphError(f"{p.name}: unknown expression {e!r}")


def _check_panel_gemm(p: TileProgram, s: PanelGemm, known: dict[str, Buffer], bound: set[str]) -> None:
    """What the host's product core takes: rows of A (contiguous columns) in a region of
    unit extents but its last two; a global [P, K, width] float32 weight and a float32 c
    tile of whole panels, or uint8 rows, panels [P, K / 4, width * 4] of int8 values
    (stored as int8 or int16) and an int32 c tile."""
    a, b, c = s.a.buffer, s.b, s.c
    for buf in (a, b, c):
        _check_buffer(p, buf, known)
    for o in (*s.a.offsets, s.panel0, s.k0, *(() if s.columns is None else (s.columns,))):
        _check_expr(p, o, known, bound)
    rank = len(a.shape)
    if len(s.a.offsets) != rank or len(s.a.extents) != rank or rank < 2:
        raise GraphError(f"{p.name}: panel product region rank does not match {a.name}")
    if any(e != 1 for e in s.a.extents[:-2]) or s.a.extents[-1] > a.shape[-1]:
        raise GraphError(f"{p.name}: a panel product reads rows of {a.name}{list(a.shape)}, not {s.a.extents}")
    if b.scope is not Scope.GLOBAL or len(b.shape) != 3:
        raise GraphError(f"{p.name}: panel weight {b.name}{list(b.shape)} is not a global [P, K, width]")
    if len(c.shape) != 2 or c.shape[0] != s.a.extents[-2] or c.shape[1] % s.width or s.k_block < 1:
        raise GraphError(f"{p.name}: panel product tile {c.name}{list(c.shape)} does not take {s.a.extents[-2]} rows of "
                         f"whole {s.width}-column panels")
    if (a.dtype, b.dtype, c.dtype) not in ((DType.FLOAT32,) * 3, (DType.UINT8, DType.INT8, DType.INT32),
                                           (DType.UINT8, DType.INT16, DType.INT32)):
        raise GraphError(f"{p.name}: a panel product is float32, or uint8 x int8 (int8 or int16 panels) -> int32 "
                         f"({a.dtype}, {b.dtype}, {c.dtype})")
    if b.shape[2] % s.k_group:
        raise GraphError(f"{p.name}: integer panels {b.name}{list(b.shape)} are not of whole groups of {s.k_group} K values")


def _check_strided_gemm(p: TileProgram, s: StridedGemm, known: dict[str, Buffer], bound: set[str]) -> None:
    """What the host's core takes in place: float32 rows of A (a region of unit extents
    but its last two) and K rows of B whose columns are one run each (unit extents
    before ``k_axis``, whole dims after the first column dim), into a float32 c tile of
    A's rows by B's columns."""
    a, b, c = s.a.buffer, s.b.buffer, s.c
    for buf in (a, b, c):
        _check_buffer(p, buf, known)
    for o in (*s.a.offsets, *s.b.offsets):
        _check_expr(p, o, known, bound)
    for r in (s.a, s.b):
        if len(r.offsets) != len(r.buffer.shape) or len(r.extents) != len(r.buffer.shape):
            raise GraphError(f"{p.name}: strided product region rank does not match {r.buffer.name}")
    if len(a.shape) < 2 or any(e != 1 for e in s.a.extents[:-2]):
        raise GraphError(f"{p.name}: a strided product reads rows of {a.name}{list(a.shape)}, not {s.a.extents}")
    kx = s.k_axis
    if not 0 <= kx < len(b.shape) - 1 or any(e != 1 for e in s.b.extents[:kx]) \
            or s.b.extents[kx + 2:] != b.shape[kx + 2:]:
        raise GraphError(f"{p.name}: a strided product's B rows ({b.name}{list(b.shape)}, {s.b.extents}, K dim {kx}) "
                         f"are not runs")
    columns = 1
    for e in s.b.extents[kx + 1:]:
        columns *= e
    if s.a.extents[-1] != s.b.extents[kx] or c.shape != (s.a.extents[-2], columns):
        raise GraphError(f"{p.name}: strided product {s.a.extents} x {s.b.extents} -> {c.name}{list(c.shape)} does not fit")
    if {a.dtype, b.dtype, c.dtype} != {DType.FLOAT32}:
        raise GraphError(f"{p.name}: a strided product is float32 ({a.dtype}, {b.dtype}, {c.dtype})")
    if s.a_blocks and (s.a_blocks < 0 or len(a.shape) != 2 or a.shape[0] % s.a_blocks or s.a.extents[0] != s.a_blocks):
        raise GraphError(f"{p.name}: a strided product reads {s.a.extents} of {a.name}{list(a.shape)} bound in row "
                         f"blocks of tiles of {s.a_blocks} rows: not one whole tile")


def _check_transpose(p: TileProgram, s: Transpose, known: dict[str, Buffer], bound: set[str]) -> None:
    """What the host's block transpose takes: two float32 regions whose rows are runs
    (``transpose_dims``: unit extents but two dims, the second of them the buffer's last;
    or the dims after a row dim whole but the first of them), rows and columns swapped."""
    for r in (s.src, s.dst):
        _check_buffer(p, r.buffer, known)
        for o in r.offsets:
            _check_expr(p, o, known, bound)
        if len(r.offsets) != len(r.buffer.shape) or len(r.extents) != len(r.buffer.shape):
            raise GraphError(f"{p.name}: transpose region rank does not match {r.buffer.name}")
        if r.buffer.dtype is not DType.FLOAT32 or len(r.extents) < 2 or not transpose_rows_are_runs(r):
            raise GraphError(f"{p.name}: a transpose turns float32 rows of runs, not {r.buffer.name}"
                             f"{list(r.buffer.shape)} {r.buffer.dtype} {r.extents}")
    if transpose_dims(s.src)[1:] != transpose_dims(s.dst)[1:][::-1]:
        raise GraphError(f"{p.name}: transpose {s.src.extents} -> {s.dst.extents} does not fit")


def _check_lane_taps(p: TileProgram, s: LaneTaps, known: dict[str, Buffer]) -> None:
    """Three float32 [position, lane] buffers of as many lanes (16: the host's helper's
    vectors), a weight row a tap, every position read inside ``x``."""
    for buf in (s.x, s.w, s.out):
        _check_buffer(p, buf, known)
        if buf.dtype is not DType.FLOAT32 or len(buf.shape) != 2 or buf.shape[1] != 16:
            raise GraphError(f"{p.name}: lane taps take float32 [positions, 16] buffers, not {buf.name}{list(buf.shape)}")
    last = (s.rows - 1) * s.row_step + (s.width - 1) * s.col_step + max(s.offsets, default=0)
    if (not s.offsets or s.w.shape[0] != len(s.offsets) or s.out.shape[0] < s.rows * s.width or min(s.offsets) < 0
            or last >= s.x.shape[0] or min(s.rows, s.width, s.row_step, s.col_step) <= 0):
        raise GraphError(f"{p.name}: lane taps over {s.rows} x {s.width} positions do not fit {s.x.name}{list(s.x.shape)}, "
                         f"{s.w.name}{list(s.w.shape)}, {s.out.name}{list(s.out.shape)}")


def _check_plane_taps(p: TileProgram, s: PlaneTaps, known: dict[str, Buffer], bound: set[str]) -> None:
    """What the host's helper takes: float32 buffers, a dense NCHW input, a weight row of
    kh x kw taps a channel and an output row of ``rows x width`` sums a channel, positive
    sizes, strides and dilations, pads inside the kernel's reach."""
    for buf in (s.x, s.w, s.out):
        _check_buffer(p, buf, known)
        if buf.dtype is not DType.FLOAT32:
            raise GraphError(f"{p.name}: plane taps are float32, not {buf.name} ({buf.dtype})")
    for e in (s.image, s.channel0, s.row0):
        _check_expr(p, e, known, bound)
    (kh, kw), (sy, sx), (dy, dx), (top, left) = s.kernel, s.strides, s.dilations, s.pads
    fits = (len(s.x.shape) == 4 and len(s.w.shape) == 2 and len(s.out.shape) == 2
            and s.w.shape[1] == kh * kw and s.out.shape[0] == s.w.shape[0] <= s.x.shape[1]
            and s.out.shape[1] >= s.rows * s.width and min(s.rows, s.width, kh, kw, sy, sx, dy, dx) > 0
            and 0 <= top < (kh - 1) * dy + 1 and 0 <= left < (kw - 1) * dx + 1)
    if not fits:
        raise GraphError(f"{p.name}: plane taps of {s.x.name}{list(s.x.shape)} by {s.w.name}{list(s.w.shape)} "
                         f"({kh} x {kw}, strides {s.strides}, dilations {s.dilations}, pads {s.pads}) over {s.rows} x "
                         f"{s.width} positions into {s.out.name}{list(s.out.shape)} do not fit")


def _check_winograd(p: TileProgram, s: Winograd, known: dict[str, Buffer], bound: set[str]) -> None:
    """What the host's helper takes: float32 buffers, an NCHW input, the transformed
    weight [Cout / n, C / k_chunk, 36, n, k_chunk] of x's channels in blocks of c's ``n``
    rows (a constant k0 is checked to start one), c [n, rows x width] at least, v [36,
    k_chunk, tiles] and m [36, n, tiles] on chip."""
    for buf in (s.x, s.u, s.v, s.m, s.c):
        _check_buffer(p, buf, known)
        if buf.dtype is not DType.FLOAT32:
            raise GraphError(f"{p.name}: a Winograd convolution is float32, not {buf.name} ({buf.dtype})")
    for e in (s.image, s.row0, s.k0):
        _check_expr(p, e, known, bound)
    th, tw = s.tiles
    k = s.c.shape[0] if len(s.c.shape) == 2 else 0
    kc = s.v.shape[1] if len(s.v.shape) == 3 else 0
    fits = (len(s.x.shape) == 4 and len(s.c.shape) == 2 and kc > 0 and k > 0
            and len(s.u.shape) == 5 and s.u.shape[1:] == (s.x.shape[1] // kc, 36, k, kc) and s.x.shape[1] % kc == 0
            and s.c.shape[1] >= s.rows * s.width and min(s.rows, s.width) > 0
            and s.v.shape == (36, kc, th * tw) and s.m.shape == (36, k, th * tw)
            and not (isinstance(s.k0, Const) and (int(s.k0.value) % k or int(s.k0.value) // k >= s.u.shape[0]))
            and s.x.scope is Scope.GLOBAL and Scope.GLOBAL not in (s.v.scope, s.m.scope, s.c.scope))
    if not fits:
        raise GraphError(f"{p.name}: Winograd convolution of {s.x.name}{list(s.x.shape)} by {s.u.name}{list(s.u.shape)} over "
                         f"{s.rows} x {s.width} positions into {s.c.name}{list(s.c.shape)} (scratch {s.v.name}{list(s.v.shape)}, "
                         f"{s.m.name}{list(s.m.shape)}) does not fit")


def _check_tap_gemm(p: TileProgram, s: TapGemm, known: dict[str, Buffer], bound: set[str]) -> None:
    """What the host's core takes from an on-chip buffer: float32 rows of A (a region of
    unit extents but its last two, K = one column per offset) and K rows of B, each
    ``c``'s width of ``b`` from its offset, all inside ``b``."""
    a, b, c = s.a.buffer, s.b, s.c
    for buf in (a, b, c):
        _check_buffer(p, buf, known)
    for o in s.a.offsets:
        _check_expr(p, o, known, bound)
    if len(s.a.offsets) != len(a.shape) or len(s.a.extents) != len(a.shape) or len(a.shape) < 2 \
            or any(e != 1 for e in s.a.extents[:-2]):
        raise GraphError(f"{p.name}: a tap product reads rows of {a.name}{list(a.shape)}, not {s.a.extents}")
    if b.scope is Scope.GLOBAL or len(c.shape) != 2 or c.shape[0] != s.a.extents[-2] or s.a.extents[-1] != len(s.offsets):
        raise GraphError(f"{p.name}: tap product {s.a.extents} x {len(s.offsets)} offsets of {b.name} -> "
                         f"{c.name}{list(c.shape)} does not fit")
    if not s.offsets or min(s.offsets) < 0 or max(s.offsets) + c.shape[1] > math.prod(b.shape):
        raise GraphError(f"{p.name}: a tap product's rows of {b.name}{list(b.shape)} leave it "
                         f"(offsets {min(s.offsets, default=0)}..{max(s.offsets, default=0)}, {c.shape[1]} columns)")
    if {a.dtype, b.dtype, c.dtype} != {DType.FLOAT32}:
        raise GraphError(f"{p.name}: a tap product is float32 ({a.dtype}, {b.dtype}, {c.dtype})")


def _check_stmt(p: TileProgram, s: object, known: dict[str, Buffer], bound: set[str]) -> None:
    if isinstance(s, Loop):
        if s.var.name in bound:
            raise GraphError(f"{p.name}: loop variable {s.var.name} shadows another")
        for b in s.body:
            _check_stmt(p, b, known, bound | {s.var.name})
    elif isinstance(s, If):
        if dtype_of(s.cond) is not DType.BOOL:
            raise GraphError(f"{p.name}: an if condition must be bool, got {format_expr(s.cond)}")
        _check_expr(p, s.cond, known, bound)
        for b in s.body:
            _check_stmt(p, b, known, bound)
    elif isinstance(s, Store):
        _check_buffer(p, s.buffer, known)
        if len(s.indices) != len(s.buffer.shape):
            raise GraphError(f"{p.name}: {len(s.indices)} indices into {s.buffer.name} of rank {len(s.buffer.shape)}")
        for e in (*s.indices, s.value):
            _check_expr(p, e, known, bound)
    elif isinstance(s, Fill):
        _check_buffer(p, s.buffer, known)
    elif isinstance(s, Copy):
        for r in (s.src, s.dst):
            _check_buffer(p, r.buffer, known)
            if len(r.offsets) != len(r.buffer.shape) or len(r.extents) != len(r.buffer.shape):
                raise GraphError(f"{p.name}: copy region rank does not match {r.buffer.name}")
            for o in r.offsets:
                _check_expr(p, o, known, bound)
        if math.prod(s.src.extents) != math.prod(s.dst.extents):
            raise GraphError(f"{p.name}: copy extents {s.src.extents} vs {s.dst.extents}")
        if s.bulk and not (_whole(s.dst) and (s.src.buffer.scope is Scope.GLOBAL or _whole(s.src)
                                               and s.src.buffer.shape == s.dst.buffer.shape)):
            raise GraphError(f"{p.name}: a bulk copy fills a whole on-chip tile from a global tensor or from a whole "
                             f"tile of its shape, not {s.src.buffer.name} -> {s.dst.buffer.name}")
    elif isinstance(s, Gemm):
        for operand in (s.a, s.b, s.c):
            _check_buffer(p, operand, known)
        (m, k) = s.a.shape[::-1] if s.trans_a else s.a.shape
        (k2, n) = s.b.shape[::-1] if s.trans_b else s.b.shape
        if k != k2 or s.c.shape != (m, n):
            raise GraphError(f"{p.name}: gemm tiles {s.a.shape} x {s.b.shape} -> {s.c.shape} do not fit")
    elif isinstance(s, PanelGemm):
        _check_panel_gemm(p, s, known, bound)
    elif isinstance(s, StridedGemm):
        _check_strided_gemm(p, s, known, bound)
    elif isinstance(s, TapGemm):
        _check_tap_gemm(p, s, known, bound)
    elif isinstance(s, Transpose):
        _check_transpose(p, s, known, bound)
    elif isinstance(s, LaneTaps):
        _check_lane_taps(p, s, known)
    elif isinstance(s, PlaneTaps):
        _check_plane_taps(p, s, known, bound)
    elif isinstance(s, Winograd):
        _check_winograd(p, s, known, bound)
    elif isinstance(s, ReduceTile):
        _check_buffer(p, s.src, known)
        _check_buffer(p, s.dst, known)
    else:
        raise GraphError(f"{p.name}: unknown statement {s!r}")
