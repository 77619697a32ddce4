"""The row schedule: norms, softmax and elementwise chains, tiled over rows.

A group without contractions whose reductions all reduce the last axis of one shape
``[..., E]`` (keeping dims) is computed as tiles of ``br`` whole rows: per tile, each
reduction's input is gathered into a ``br x E`` tile and reduced (ReduceTile) into a
per-row buffer, in group order (a variance reads its mean), then every output is written
from its element expression, reading the per-row results where they broadcast. A group
with no reduction at all is the same with no reduction stage: tiles of rows of its output
shape. Inputs reach the tiles through their element expressions (gathers, reshapes,
casts: the prologue), so an embedding lookup + add + LayerNorm is one pass.

Rows longer than the target's ``max_row`` do not fit a tile whole, and on a device with
blocks whole rows may not split evenly over a block's threads (rows of 8400): a tile is
then one row, walked in chunks of at most ``tile_elems`` (a whole number of the block's
threads). Each
reduction folds chunk after chunk into its per-row buffer (columns past the row's end
give the reduction's identity), and every output is stored chunk by chunk from global
memory again: the row is read once per reduction and once for the outputs, at any
length.

Which groups take it is the rows pattern's answer (``patterns/rows.py``: everything
downstream of a reduction elementwise on row-aligned shapes, so each output element
depends only on its own row); this module tiles the match it is given.
"""
from __future__ import annotations

import math

from tilefuse.ir.graph import Node, Value
from tilefuse.ir.prims import ScalarFn
from tilefuse.partition.model import FusedGroup
from tilefuse.patterns import RowsMatch
from tilefuse.target import CPU, Target
from tilefuse.tile_ir.ir import (
    Buffer,
    Call,
    Expr,
    Fill,
    IOp,
    Load,
    Loop,
    LoopKind,
    ReduceTile,
    Scope,
    Stmt,
    Store,
    TileProgram,
    Var,
    const_index,
    iop,
)
from tilefuse.tile_ir.lower.common import (Names, accumulator_dtype, divisor_tile, even_divisor, fill_cores, identity,
                                           parallel)
from tilefuse.tile_ir.lower.elements import ElementBuilder, Index, delinearize, linearize
from tilefuse.tile_ir.lower.params import kernel_params
from tilefuse.tile_ir.schedule import RowsSchedule


def lower_rows(group: FusedGroup, match: RowsMatch, name: str,
               target: Target = CPU) -> tuple[TileProgram, tuple[Value, ...]]:
    """The row-tiled program of ``match`` and the values bound to its params."""
    return _Rows(group, list(match.reductions), match.shape, name, target).build()


class _Rows:
    def __init__(self, group: FusedGroup, reductions: list[Node], shape: tuple[int, ...], name: str,
                 target: Target) -> None:
        self.group, self.reductions, self.shape, self.name = group, reductions, shape, name
        self.cores, self.warp = target.device.cores, target.device.warp
        self.blocks = target.device.max_block_threads  # 0: no blocks (the CPU)
        self.policy = target.rows
        self.names = Names()

    def row_tile(self, rows: int, e: int) -> tuple[int, int]:
        """Rows per tile, and the lanes each row was sized for (0: none in particular).
        At most ``tile_elems`` per tile; where the target has warps and there are
        reductions, a power of two of rows that gives each row whole warps of
        threads // br lanes dividing E (the CUDA emitter's one-warp-per-row form) where
        one exists. Fewer tiles than cores: fewer rows per tile (down to one), as long as
        rows keep those whole warps. On a device with blocks, a row count whose tile the
        block's threads divide where one does."""
        cap = max(1, self.policy.tile_elems // e)
        br, floor, warp_rows = divisor_tile(rows, cap), 1, False
        if self.warp and self.reductions:
            most = self.policy.threads // self.warp  # rows of one warp each
            fits = [t for t in (2**k for k in range(most.bit_length()))
                    if t <= cap and rows % t == 0 and e % (self.policy.threads // t) == 0]
            if fits:
                br, floor, warp_rows = max(fits), min(fits), True
        (br,) = fill_cores((rows,), [br], 1, self.cores, floor)
        t = self.policy.threads
        if self.blocks and not warp_rows and br * e >= t and br * e % t:
            # a tile the block's threads do not split evenly (thread fitting would narrow the
            # block: YOLO's 10 rows of 160, 64 threads): of the row counts up to br that
            # divide the rows, the one whose tile has the largest power of two (up to the
            # block's threads), then the most rows
            br = even_divisor(rows, br, e, t)
        return br, self.policy.threads // br if warp_rows else 0

    def chunk(self, e: int) -> int:
        """Columns of one chunk of a row longer than ``max_row``: the row in as few chunks
        of at most ``tile_elems`` as it takes, each a whole number of the block's threads
        (every parallel nest then splits evenly over them)."""
        t = self.policy.threads
        chunks = -(-e // self.policy.tile_elems)
        per_chunk = -(-e // chunks)
        return min(-(-per_chunk // t) * t, max(t, self.policy.tile_elems // t * t))

    def build(self) -> tuple[TileProgram, tuple[Value, ...]]:
        rows, e = math.prod(self.shape[:-1]), self.shape[-1]
        chunk = self.chunk(e) if e > self.policy.max_row else 0
        br, lanes = (1, 0) if chunk else self.row_tile(rows, e)
        t = self.policy.threads
        if not chunk and self.blocks and e >= t and br * e % t:
            # whole rows the block's threads do not split evenly: thread fitting would narrow
            # the block (YOLO's rows of 8400 anchors: 16 threads of 525 elements each, unrolled
            # into a 1.2 MB cubin); one row a tile in chunks of whole blocks instead
            chunk, br, lanes = self.chunk(e), 1, 0
        kp = kernel_params(self.group)
        params, buffers = kp.params, kp.buffers
        rt = Var("br")
        r0 = iop(IOp.MUL, rt, br)
        row_of = {id(r.outputs[0]): Buffer(f"row{k}", accumulator_dtype(r.outputs[0].type.dtype), (br,), Scope.FRAGMENT)
                  for k, r in enumerate(self.reductions)}

        def read(v: Value, idx: Index) -> Expr:
            buf = row_of.get(id(v))
            if buf is None:
                return Load(buffers[id(v)], idx)
            load: Expr = Load(buf, (iop(IOp.SUB, linearize(idx[:-1], v.type.shape[:-1]), r0),))
            return load if buf.dtype is v.type.dtype else Call(ScalarFn.CAST, (load,), v.type.dtype)

        for key, buf in row_of.items():
            buffers[key] = buf
        el = ElementBuilder(buffers, read, kp.sites)

        def index(i: Expr, j: Expr) -> Index:  # element (i, j) of the tile, in the row shape
            return (*delinearize(iop(IOp.ADD, r0, i), self.shape[:-1]), j)

        body: list[Stmt] = []
        tiles: list[Buffer] = []
        chunks = -(-e // chunk) if chunk else 1

        for k, r in enumerate(self.reductions):  # in group order: a variance reads its mean
            x, fn = r.inputs[0], r.op.fn  # type: ignore[attr-defined]  # a RowsMatch reduction is a Reduce
            row = row_of[id(r.outputs[0])]
            tile = Buffer(f"x_tile{k}", row.dtype, (br, chunk or e), Scope.FRAGMENT)
            tiles.append(tile)
            ct = self.names.var("ct") if chunk else None
            c0 = iop(IOp.MUL, ct, chunk) if ct is not None else const_index(0)

            def fill(ij: Index, x: Value = x, tile: Buffer = tile, c0: Expr = c0, fn=fn) -> list[Stmt]:
                col = iop(IOp.ADD, c0, ij[1])
                past = chunk and chunks * chunk > e  # the last chunk runs past the row's end
                val = el.at(x, index(ij[0], iop(IOp.MIN, col, e - 1) if past else col))
                if x.type.dtype is not tile.dtype:
                    val = Call(ScalarFn.CAST, (val,), tile.dtype)
                if past:
                    val = Call(ScalarFn.WHERE, (iop(IOp.LT, col, e), val, identity(fn, tile.dtype)), tile.dtype)
                return [Store(tile, ij, val)]

            fold: list[Stmt] = [*parallel(self.names, (br, chunk or e), fill), ReduceTile(tile, row, fn, 1, clear=not chunk)]
            if ct is not None:  # chunk after chunk folded into the row's buffer
                body += [Fill(row, identity(fn, row.dtype)), Loop(ct, chunks, LoopKind.SERIAL, tuple(fold))]
            else:
                body += fold
            el.memo.clear()
        for v, out in zip(self.group.outputs, kp.outputs):
            per_row = v.type.shape == self.shape[:-1]  # a per-row output without its unit axis
            width = 1 if per_row else v.type.shape[-1]
            split = chunk and width == e  # a row-wide output of a long row: stored chunk by chunk
            ct = self.names.var("ct") if split else None
            c0 = iop(IOp.MUL, ct, chunk) if ct is not None else const_index(0)

            def store(ij: Index, v: Value = v, out: Buffer = out, c0: Expr = c0, split: int = split,
                      per_row: bool = per_row) -> list[Stmt]:
                # past the row's end the last chunk stores the last column again, the same value
                j = iop(IOp.MIN, iop(IOp.ADD, c0, ij[1]), e - 1) if split and chunks * chunk > e else \
                    iop(IOp.ADD, c0, ij[1]) if split else ij[1]
                if per_row:
                    idx = index(ij[0], j)[:-1]
                elif v.type.shape in (self.shape, self.shape[:-1] + (1,)):
                    idx = index(ij[0], j)  # a per-row output has width 1: j is 0
                else:  # the rows regrouped by a reshape
                    idx = (*delinearize(iop(IOp.ADD, r0, ij[0]), v.type.shape[:-1]), j)
                return [Store(out, idx, el.at(v, idx))]

            nest = parallel(self.names, (br, chunk if split else width), store)
            body += [Loop(ct, chunks, LoopKind.SERIAL, tuple(nest))] if ct is not None else nest
            el.memo.clear()
        grid = (rows // br,)
        what = f"{len(self.reductions)} row reductions" if self.reductions else "elementwise"
        notes = (f"rows: {what}, tiles of {br} rows x {e}, grid {grid}"
                 + (f", each row in {chunks} chunks of {chunk}" if chunk else ""),)
        allocs = (*row_of.values(), *tiles)
        # warps per row (GPU): every tile resident at once where a few per core do it, so the
        # code generator keeps the registers to that (bert-base b32's 512 norm tiles: 4 a core)
        waves = -(-math.prod(grid) // self.cores)
        occupancy = waves if self.warp and self.reductions and 1 < waves <= self.policy.max_resident else 0
        if occupancy:
            notes = (notes[0] + f", {occupancy} tiles resident per core",)
        schedule = RowsSchedule(rows=rows, width=e, rows_per_tile=br, threads=self.policy.threads,
                                reductions=len(self.reductions), lanes_per_row=lanes, occupancy=occupancy, chunk=chunk)
        program = TileProgram(self.name, tuple(params), kp.num_inputs, grid, (rt,), self.policy.threads, allocs, tuple(body), notes,
                              occupancy=occupancy, schedule=schedule)
        return program, tuple(kp.bindings)
