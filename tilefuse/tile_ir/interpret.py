"""A numpy interpreter for TileProgram: the oracle every code generator is tested against.

Tiles run one after another. Parallel loops are vectorised: each parallel variable gets
its own numpy axis, so a loop nest of Stores runs as a few array operations. Loads in an
untaken branch of a WHERE may index outside their buffer (generated code evaluates only
the taken branch); anywhere else an out-of-range index is an error. An ``IndexCheck``
whose index is out of range writes the status word as a kernel does (only for the lanes
whose branches are taken).
"""
from __future__ import annotations

import itertools
from typing import Callable, Sequence

import numpy as np

from tilefuse.ir.prims import Map, ReduceFn, ScalarFn
from tilefuse.tile_ir import row_blocks
from tilefuse.tile_ir.ir import (
    Call,
    Const,
    Copy,
    Expr,
    Fill,
    Gemm,
    If,
    IndexCheck,
    IndexOp,
    IOp,
    LaneTaps,
    Load,
    Loop,
    LoopKind,
    PanelGemm,
    PlaneTaps,
    ReduceTile,
    Region,
    Store,
    StridedGemm,
    TapGemm,
    TileProgram,
    Transpose,
    Var,
    Winograd,
    WINOGRAD_AT,
    WINOGRAD_BT,
    WINOGRAD_TILE,
    transpose_dims,
)

_IOPS = {
    IOp.ADD: np.add, IOp.SUB: np.subtract, IOp.MUL: np.multiply, IOp.FLOORDIV: np.floor_divide,
    IOp.MOD: np.mod, IOp.MIN: np.minimum, IOp.MAX: np.maximum, IOp.LT: np.less, IOp.LE: np.less_equal,
    IOp.GE: np.greater_equal, IOp.EQ: np.equal, IOp.AND: np.logical_and, IOp.OR: np.logical_or,
}
_REDUCE: dict[ReduceFn, Callable[..., np.ndarray]] = {ReduceFn.SUM: np.sum, ReduceFn.MAX: np.max, ReduceFn.MIN: np.min, ReduceFn.PROD: np.prod}
_COMBINE: dict[ReduceFn, Callable[..., np.ndarray]] = {ReduceFn.SUM: np.add, ReduceFn.MAX: np.maximum, ReduceFn.MIN: np.minimum, ReduceFn.PROD: np.multiply}


class TileInterpreterError(RuntimeError):
    pass


def run_program(program: TileProgram, args: Sequence[np.ndarray], status: np.ndarray | None = None) -> None:
    """Run ``program`` on ``args`` (its params, in order); outputs are written in place.

    A program with index checks records an index out of range in ``status`` (int64[2], as
    the kernel's status word: site + 1 and the value, only while word 0 is 0); without
    one such an index is a TileInterpreterError."""
    if len(args) != len(program.params):
        raise TileInterpreterError(f"{program.name}: {len(program.params)} params, {len(args)} arrays")
    for p, a in zip(program.params, args):
        if a.shape != p.shape or a.dtype != p.dtype.numpy:
            raise TileInterpreterError(f"{program.name}: param {p.name} is {p.dtype}{p.shape}, got {a.dtype}{a.shape}")
    word = np.zeros(2, np.int64) if status is None else status
    if word.shape != (2,) or word.dtype != np.int64:
        raise TileInterpreterError(f"{program.name}: the status word is int64[2], got {word.dtype}{list(word.shape)}")
    for coords in itertools.product(*(range(g) for g in program.grid)):
        state = _State({p.name: a for p, a in zip(program.params, args)}, word)
        for buf in program.allocs:
            state.buffers[buf.name] = np.zeros(buf.shape, buf.dtype.numpy)
        for var, c in zip(program.block_vars, coords):
            state.env[var.name] = np.int64(c)
        state.run(program.body)
    if status is None and word[0]:
        raise TileInterpreterError(f"{program.name}: index check {word[0] - 1} found {word[1]} out of range")


class _State:
    def __init__(self, buffers: dict[str, np.ndarray], status: np.ndarray | None = None) -> None:
        self.buffers = buffers
        self.status = np.zeros(2, np.int64) if status is None else status
        self.env: dict[str, np.ndarray | np.int64] = {}
        self.depth = 0  # number of enclosing parallel loops (= vector axes)
        # row-blocked buffers (StridedGemm.a_blocks) as rows: (buffer, tile) -> (array, rows)
        self._unblocked: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}

    # -- statements -------------------------------------------------------------------
    def run(self, body: Sequence[object]) -> None:
        for stmt in body:
            self.stmt(stmt)

    def stmt(self, s: object) -> None:
        if isinstance(s, Loop):
            self.loop(s)
        elif isinstance(s, Store):
            self.store(s)
        elif isinstance(s, Fill):
            self.buffers[s.buffer.name][...] = np.asarray(s.value.value).astype(s.buffer.dtype.numpy)
        elif isinstance(s, Copy):
            self.copy(s)
        elif isinstance(s, Gemm):
            self.gemm(s)
        elif isinstance(s, PanelGemm):
            self.panel_gemm(s)
        elif isinstance(s, StridedGemm):
            self.strided_gemm(s)
        elif isinstance(s, TapGemm):
            self.tap_gemm(s)
        elif isinstance(s, Transpose):
            self.transpose(s)
        elif isinstance(s, LaneTaps):
            self.lane_taps(s)
        elif isinstance(s, PlaneTaps):
            self.plane_taps(s)
        elif isinstance(s, Winograd):
            self.winograd(s)
        elif isinstance(s, ReduceTile):
            self.reduce(s)
        elif isinstance(s, If):
            cond = np.asarray(self.expr(s.cond))
            if cond.ndim:  # a parallel loop's variable in the condition: threads would diverge
                raise TileInterpreterError(f"if {s.cond!r}: the condition is not uniform over the tile")
            if bool(cond):
                self.run(s.body)
        else:
            raise TileInterpreterError(f"unknown statement {s!r}")

    def loop(self, s: Loop) -> None:
        if s.kind is LoopKind.PARALLEL:
            saved = dict(self.env)
            for k, v in self.env.items():  # every vector gets one more (trailing) axis
                if isinstance(v, np.ndarray) and v.ndim == self.depth:
                    self.env[k] = v[..., None]
            self.env[s.var.name] = np.arange(s.extent, dtype=np.int64).reshape((1,) * self.depth + (s.extent,))
            self.depth += 1
            try:
                self.run(s.body)
            finally:
                self.depth -= 1
                self.env = saved
            return
        for i in range(s.extent):
            self.env[s.var.name] = np.int64(i)
            self.run(s.body)
        self.env.pop(s.var.name, None)

    def store(self, s: Store) -> None:
        target = self.buffers[s.buffer.name]
        idx = [self.expr(e) for e in s.indices]
        val = self.expr(s.value)
        arrays = np.broadcast_arrays(*idx, val) if idx else [val]
        *idx_b, val_b = arrays
        for k, (ix, n) in enumerate(zip(idx_b, target.shape)):
            if np.any((ix < 0) | (ix >= n)):
                raise TileInterpreterError(f"store to {s.buffer.name} out of range on dim {k}")
        target[tuple(idx_b)] = np.asarray(val_b).astype(target.dtype, copy=False)

    def copy(self, s: Copy) -> None:
        src, dst = self.buffers[s.src.buffer.name], self.buffers[s.dst.buffer.name]
        so = [int(self.expr(e)) for e in s.src.offsets]
        do = [int(self.expr(e)) for e in s.dst.offsets]
        block = np.zeros(s.src.extents, dtype=src.dtype)
        s_sl, b_sl = _clip(so, s.src.extents, src.shape)
        if s_sl is not None:
            block[b_sl] = src[s_sl]
        block = block.reshape(s.dst.extents)  # extents may differ by unit dims
        d_sl, b_sl = _clip(do, s.dst.extents, dst.shape)
        if d_sl is not None:
            dst[d_sl] = block[b_sl].astype(dst.dtype, copy=False)

    def gemm(self, s: Gemm) -> None:
        a, b, c = (self.buffers[x.name] for x in (s.a, s.b, s.c))
        a = a.T if s.trans_a else a
        b = b.T if s.trans_b else b
        wide = np.float32 if c.dtype.kind == "f" and c.dtype.itemsize <= 4 else c.dtype
        c[...] = (c.astype(wide) + np.matmul(a.astype(wide), b.astype(wide))).astype(c.dtype)

    def panel_gemm(self, s: PanelGemm) -> None:
        a, b, c = self.buffers[s.a.buffer.name], self.buffers[s.b.name], self.buffers[s.c.name]
        at = [int(self.expr(e)) for e in s.a.offsets]
        p0, k0, width = int(self.expr(s.panel0)), int(self.expr(s.k0)), s.width
        rows = max(0, min(s.a.extents[-2], a.shape[-2] - at[-2]))
        kc = max(0, min(s.a.extents[-1], s.k_rows - k0))
        where: tuple[int | slice, ...] = (*at[:-2], slice(at[-2], at[-2] + rows), slice(at[-1], at[-1] + kc))
        a_rows = a[where]
        n = c.shape[1] if s.columns is None else int(self.expr(s.columns))
        chosen = b[p0:p0 + n // width]
        if s.k_group > 1:  # integer panels [P, K / 4, width * 4] -> [P, K, width]
            p, groups = chosen.shape[:2]
            chosen = chosen.reshape(p, groups, width, s.k_group).transpose(0, 1, 3, 2).reshape(p, groups * s.k_group, width)
        w = chosen[:, k0:k0 + kc].transpose(1, 0, 2).reshape(kc, -1)  # [panels, kc, width] -> kc x columns
        wide = np.int64 if c.dtype.kind == "i" else np.float32
        c[:rows, :n] = (c[:rows, :n] + np.matmul(a_rows.astype(wide), w.astype(wide))).astype(c.dtype)

    def strided_gemm(self, s: StridedGemm) -> None:
        a, b, c = self.buffers[s.a.buffer.name], self.buffers[s.b.buffer.name], self.buffers[s.c.name]
        if s.a_blocks:  # (a constant weight: turned back into rows once)
            key = (id(a), s.a_blocks)
            if key not in self._unblocked:
                self._unblocked[key] = (a, row_blocks.unpack(a, s.a_blocks))
            a = self._unblocked[key][1]
        a_rows = a[self._window(s.a)].reshape(s.a.extents[-2:])
        b_rows = b[self._window(s.b)].reshape(s.b.extents[s.k_axis], -1)
        c[...] = (c + np.matmul(a_rows.astype(np.float32), b_rows.astype(np.float32))).astype(c.dtype)

    def tap_gemm(self, s: TapGemm) -> None:
        a, b, c = self.buffers[s.a.buffer.name], self.buffers[s.b.name].reshape(-1), self.buffers[s.c.name]
        a_rows = a[self._window(s.a)].reshape(s.a.extents[-2:])
        n = c.shape[1]
        b_rows = np.stack([b[o:o + n] for o in s.offsets])
        c[...] = (c + np.matmul(a_rows.astype(np.float32), b_rows.astype(np.float32))).astype(c.dtype)

    def transpose(self, s: Transpose) -> None:
        src, dst = self.buffers[s.src.buffer.name], self.buffers[s.dst.buffer.name]
        _, rows, cols = transpose_dims(s.src)
        block = src[self._window(s.src)].reshape(rows, cols)
        view = dst[self._window(s.dst)]
        view[...] = block.T.reshape(view.shape).astype(dst.dtype)

    def lane_taps(self, s: LaneTaps) -> None:
        x, w, out = self.buffers[s.x.name], self.buffers[s.w.name], self.buffers[s.out.name]
        at = (np.arange(s.rows)[:, None] * s.row_step + np.arange(s.width)[None, :] * s.col_step).reshape(-1)
        total = np.zeros((s.rows * s.width, out.shape[-1]), np.float32)
        for t, off in enumerate(s.offsets):
            total = total + x[at + off].astype(np.float32) * w[t].astype(np.float32)
        out[:s.rows * s.width] = total.astype(out.dtype)

    def plane_taps(self, s: PlaneTaps) -> None:
        x, w, out = self.buffers[s.x.name], self.buffers[s.w.name], self.buffers[s.out.name]
        img, ch0, row0 = int(self.expr(s.image)), int(self.expr(s.channel0)), int(self.expr(s.row0))
        (kh, kw), (sy, sx), (dy, dx), (top, left) = s.kernel, s.strides, s.dilations, s.pads
        chans = w.shape[0]
        h, wd = x.shape[2:]
        iy = (row0 + np.arange(s.rows))[:, None] * sy + np.arange(kh)[None, :] * dy - top  # [row, ty]
        ix = np.arange(s.width)[:, None] * sx + np.arange(kw)[None, :] * dx - left  # [col, tx]
        planes = x[img, ch0:ch0 + chans].astype(np.float32)
        total: np.ndarray = np.zeros((chans, s.rows, s.width), np.float32)
        for ty, tx in itertools.product(range(kh), range(kw)):
            ry, cx = iy[:, ty], ix[:, tx]
            vals = planes[:, np.clip(ry, 0, h - 1)][:, :, np.clip(cx, 0, wd - 1)]
            inside = ((ry >= 0) & (ry < h))[:, None] & ((cx >= 0) & (cx < wd))[None, :]
            term = np.where(inside, vals, np.float32(0)) * w[:, ty * kw + tx].astype(np.float32)[:, None, None]
            total = (total + term).astype(np.float32)
        out[:, :s.rows * s.width] = total.reshape(chans, -1).astype(out.dtype)

    def winograd(self, s: Winograd) -> None:
        """F(4 x 4, 3 x 3) as the statement states it, in float32: every tile's patches
        turned, the 36 products summed over all channels at once, each tile turned back
        (``v`` and ``m``, the host's scratch, are left as they are)."""
        x, u, c = self.buffers[s.x.name], self.buffers[s.u.name], self.buffers[s.c.name]
        img, row0, k0 = int(self.expr(s.image)), int(self.expr(s.row0)), int(self.expr(s.k0))
        th, tw = s.tiles
        t = WINOGRAD_TILE
        chans, h, w = x.shape[1:]
        # the input rows and columns the tiles' patches cover, zero outside x
        grid = np.zeros((chans, t * th + 2, t * tw + 2), np.float32)
        r0, r1 = max(row0, 0), min(row0 + grid.shape[1], h)
        q0, q1 = max(s.col0, 0), min(s.col0 + grid.shape[2], w)
        if r0 < r1 and q0 < q1:
            grid[:, r0 - row0:r1 - row0, q0 - s.col0:q1 - s.col0] = x[img, :, r0:r1, q0:q1]
        rows = np.arange(th)[:, None] * t + np.arange(t + 2)[None, :]  # [tile row, patch row]
        cols = np.arange(tw)[:, None] * t + np.arange(t + 2)[None, :]
        d = grid[:, rows[:, None, :, None], cols[None, :, None, :]]  # [ch, th, tw, 6, 6]
        bt, at = np.asarray(WINOGRAD_BT, np.float32), np.asarray(WINOGRAD_AT, np.float32)
        v = np.einsum("ia,ctsab,jb->ijcts", bt, d, bt).reshape(36, chans, th * tw)
        k = c.shape[0]
        # the block's [36, k, C] from [C / k_chunk, 36, k, k_chunk]
        block = u[k0 // k].transpose(1, 2, 0, 3).reshape(36, k, chans)
        m = np.matmul(block.astype(np.float32), v)  # [36, k, tiles]
        y = np.einsum("pi,ijkn,qj->kpqn", at, m.reshape(6, 6, k, th * tw), at)  # [k, 4, 4, tiles]
        y = y.reshape(k, t, t, th, tw).transpose(0, 3, 1, 4, 2).reshape(k, th * t, tw * t)
        c[:, :s.rows * s.width] = y[:, :s.rows, :s.width].reshape(k, -1).astype(c.dtype)

    def _window(self, r: Region) -> tuple[slice, ...]:
        return tuple(slice(int(self.expr(o)), int(self.expr(o)) + e) for o, e in zip(r.offsets, r.extents))

    def reduce(self, s: ReduceTile) -> None:
        src, dst = self.buffers[s.src.name], self.buffers[s.dst.name]
        r = _REDUCE[s.fn](src, axis=s.dim).astype(dst.dtype)
        dst[...] = r if s.clear else _COMBINE[s.fn](dst, r)

    # -- expressions ------------------------------------------------------------------
    def expr(self, e: Expr, taken: np.ndarray | bool | None = None) -> np.ndarray:
        """``e``'s value; ``taken`` is None outside WHERE branches, else the lanes whose
        branch is taken (loads clip elsewhere, index checks record only there)."""
        if isinstance(e, Const):
            return np.asarray(e.value).astype(e.dtype.numpy)
        if isinstance(e, Var):
            return self.env[e.name]  # type: ignore[return-value]
        if isinstance(e, IndexOp):
            a, b = self.expr(e.a, taken), self.expr(e.b, taken)
            with np.errstate(divide="ignore"):
                return _IOPS[e.op](a, b)
        if isinstance(e, Load):
            return self.load(e, taken)
        if isinstance(e, Call):
            if e.fn is ScalarFn.WHERE:
                cond = np.asarray(self.expr(e.args[0], taken)).astype(bool)
                outer = True if taken is None else taken
                a = self.expr(e.args[1], np.logical_and(outer, cond))
                b = self.expr(e.args[2], np.logical_and(outer, ~cond))
                return Map(ScalarFn.WHERE).evaluate([cond, np.asarray(a), np.asarray(b)])[0]
            args = [np.asarray(self.expr(x, taken)) for x in e.args]
            prim = Map(e.fn, e.dtype) if e.fn is ScalarFn.CAST else Map(e.fn)
            return prim.evaluate(args)[0]
        if isinstance(e, IndexCheck):
            return self.check(e, taken)
        raise TileInterpreterError(f"unknown expression {e!r}")

    def check(self, e: IndexCheck, taken: np.ndarray | bool | None) -> np.ndarray:
        i = np.asarray(self.expr(e.index, taken)).astype(np.int64)
        with np.errstate(over="ignore"):
            wrapped = np.where(i < 0, i + e.extent, i)
        outside = (wrapped < 0) | (wrapped >= e.extent)
        bad = outside if taken is None else outside & taken
        if np.any(bad) and self.status[0] == 0:
            self.status[0] = e.site + 1
            self.status[1] = np.broadcast_to(i, np.shape(bad))[bad].flat[0]
        return np.where(outside, np.int64(0), wrapped)

    def load(self, e: Load, taken: np.ndarray | bool | None) -> np.ndarray:
        src = self.buffers[e.buffer.name]
        guarded = taken is not None
        idx = [np.asarray(self.expr(x, taken)).astype(np.int64) for x in e.indices]
        for k, (ix, n) in enumerate(zip(idx, src.shape)):
            bad = (ix < 0) | (ix >= n)
            if np.any(bad):
                if not guarded:
                    raise TileInterpreterError(f"load from {e.buffer.name} out of range on dim {k}")
                idx[k] = np.clip(ix, 0, max(n - 1, 0))
        if not idx:
            return src[()]
        return src[tuple(np.broadcast_arrays(*idx))]


def _clip(offsets: list[int], extents: Sequence[int], shape: Sequence[int]):
    """Slices of the buffer and of the block for the in-bounds part of a region."""
    buf, blk = [], []
    for o, e, n in zip(offsets, extents, shape):
        lo, hi = max(o, 0), min(o + e, n)
        if hi <= lo:
            return None, None
        buf.append(slice(lo, hi))
        blk.append(slice(lo - o, hi - o))
    return tuple(buf), tuple(blk)
