"""The tiled schedule for a contraction with its prologue and elementwise epilogue.

One tile per (batch..., M/bm, N/bn) block of the product: operand tiles are filled from
their element expressions (casts, scaling, transposes inlined: the prologue), a K loop
of Gemm statements accumulates the tile, and every group output is computed from the
tile while it is on chip (bias, activation, residual, reshape/transpose to heads: the
epilogue). Tiles are independent, so the grid runs in parallel.

Which groups take it, and around which products, is the gemm pattern's answer
(``patterns/gemm.py``: one product, siblings or a weight chain, and an epilogue that
gives each output element exactly one product element); this module only tiles the
match it is given.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Sequence

from tilefuse.ir.dtypes import HALF_FLOATS, DType
from tilefuse.ir.graph import Node, Value
from tilefuse.ir.prims import (
    Conv,
    ConvTranspose,
    MatMul,
    Reduce,
    ScalarFn,
)
from tilefuse.partition.model import FusedGroup
from tilefuse.patterns import GemmMatch
from tilefuse.patterns.gemm import product_extents
from tilefuse.target import CPU, Target
from tilefuse.tile_ir.ir import (
    Buffer,
    Call,
    Const,
    Expr,
    Fill,
    Gemm,
    If,
    IndexCheck,
    IndexOp,
    IOp,
    Load,
    Loop,
    LoopKind,
    Region,
    Scope,
    Stmt,
    Store,
    TileProgram,
    Transpose,
    Var,
    WINOGRAD_TILE,
    const_index,
    iop,
    map_loads,
    statements,
    subexpressions,
)
from tilefuse.tile_ir.lower import conv_rows, conv_tiles, conv_winograd, gemm_tiles, gemm_weights, panels
from tilefuse.tile_ir.lower.common import (
    COMBINE,
    Names,
    accumulator_dtype,
    divisor_tile,
    fill_cores,
    guard_all,
    identity,
    narrow,
    parallel,
    var_ids,
    widen,
)
from tilefuse.tile_ir.lower.elements import (
    ElementBuilder,
    Index,
    broadcast_index,
    delinearize,
    linearize,
)
from tilefuse.tile_ir.lower.forward import Forward, forward_index
from tilefuse.tile_ir.lower.checks import IndexSites
from tilefuse.tile_ir.schedule import GemmSchedule

# functions whose scalar C is a branch an element (GemmPolicy.staged_epilogue_selects)
_SELECTS = frozenset({ScalarFn.MAX, ScalarFn.MIN, ScalarFn.WHERE})


def _reading_turned(e: Expr, tc: Buffer, ct: Buffer) -> Expr:
    """``e`` reading ``ct``, ``tc`` transposed, where it read ``tc``."""
    return map_loads(e, lambda x: Load(ct, x.indices[::-1]) if x.buffer == tc else x)


def lower_gemm_epilogue(group: FusedGroup, match: GemmMatch, name: str,
                        target: Target = CPU) -> tuple[TileProgram, tuple[Value, ...]] | None:
    """The tiled program of ``match``'s products and the values bound to its params, or
    None where no tiles fit (awkward sizes). From ``target``: the K depth of tiles, the
    rows of a whole-row tile, and whether half-float operands stay half in their tiles
    (tensor cores take them so)."""
    contractions = list(match.contractions)
    fwd = forward_index(match.epilogue, contractions)
    builder = _Builder(group, contractions, fwd, list(match.epilogue.reductions), name, match.first, target,
                       depthwise=match.depthwise)
    program = builder.build()
    return None if program is None else (program, tuple(builder.bindings))


def _sibling_of(group: FusedGroup, cs: list[Node]) -> dict[int, int] | None:
    """For each value downstream of sibling products, the one sibling it comes from; None
    where a value mixes two (a packed tile holds one sibling's columns), or a weight is
    read by anything but its product."""
    weights = {id(c.inputs[1]) for c in cs}
    if any(id(v) in weights for n in group.nodes if n not in cs for v in n.inputs):
        return None
    if len(weights) != len(cs) or any(not c.inputs[1].is_constant for c in cs):
        return None
    of = {id(c.outputs[0]): s for s, c in enumerate(cs)}
    for n in group.nodes:
        if n in cs:
            continue
        srcs = {of[id(v)] for v in n.inputs if id(v) in of}
        if len(srcs) > 1:
            return None
        for v in n.outputs if srcs else ():
            of[id(v)] = next(iter(srcs))
    return of


class _Builder:
    # bound by gemm_weights.bind_params: the one packed operand, host panels by value,
    # and the kernel's bindings and index sites
    packed: Buffer | None
    panel_bufs: dict[int, Buffer]
    row_blocks: int = 0  # a pointwise convolution's weight in row blocks of tiles of this many rows (0: rows)
    bindings: list[Value]
    sites: IndexSites

    def __init__(self, group: FusedGroup, cs: list[Node], fwd: dict[int, Forward], reductions: list[Node],
                 name: str, first: Node | None, target: Target, *, depthwise: bool = False) -> None:
        self.group, self.cs, self.fwd, self.reductions, self.name = group, cs, fwd, reductions, name
        self.tile_k, self.row_tile, self.onchip = target.gemm.tile_k, target.gemm.row_tile, target.device.onchip_bytes
        # a host chain's K chunk (the h tile's columns): narrower where that keeps a
        # whole-row tile's rows on chip (gemm_tiles._host_whole_rows)
        self.chunk = 0
        self.cores, self.min_tile, self.gemm_tile = target.device.cores, target.gemm.min_tile, target.gemm.tile
        self.gemm_rows = target.gemm.rows or target.gemm.tile
        self.max_threads, self.acc_budget = target.gemm.max_threads, target.gemm.accumulator_bytes
        self.inflight = target.gemm.inflight_bytes
        self.mma_rows = target.device.mma_rows
        self.target = target
        # channels as tile rows (conv_rows.py): weights x im2col^T, stored along positions;
        # not for few positions per image (deep layers: 7x7), where positions x channels tiles
        # fill the product core better
        self.flip = (isinstance(cs[0].op, Conv) and target.conv.channel_rows
                     and math.prod(cs[0].outputs[0].type.shape[2:]) >= target.conv.min_positions)
        self.depthwise = depthwise
        self.flip = self.flip or self.depthwise
        self.winograd: conv_winograd.WinogradTile | None = None  # set by _build (conv_winograd.tile)
        # a grouped convolution (not depthwise), transposed or not: an implicit GEMM whose
        # column tiles each lie inside one group, so a tile reads its group's input channels only
        self.groups = 1 if self.depthwise or not isinstance(cs[0].op, (Conv, ConvTranspose)) else cs[0].op.groups
        # siblings as one product of their weights side by side (target.gemm.pack_siblings), where
        # each value downstream of a product comes from one sibling only
        self.sibling_of = _sibling_of(group, cs) if len(cs) > 1 and target.gemm.pack_siblings else None
        self._tile_at: dict[Index, Index] = {}  # product index -> c tile index, for the epilogue
        operands = {v.type.dtype for x in (*cs, *([first] if first else [])) for v in x.inputs[:2]}
        (only,) = operands if len(operands) == 1 else (None,)
        # operand tiles: the operands' half type for tensor cores, else the accumulator type
        self.op_dtype = only if target.gemm.half_operand_tiles and only in HALF_FLOATS else accumulator_dtype(cs[0].outputs[0].type.dtype)
        self.first = first  # a weight chain's first product, computed a K chunk at a time
        self.tf32 = target.tf32_products and self.op_dtype is DType.FLOAT32  # --precision tf32
        c = self.c = cs[0]
        self.names = Names()
        self.acc_dtype = accumulator_dtype(c.outputs[0].type.dtype)
        self.batch, self.m, self.n, self.k = product_extents(c)
        # a product by a 2-D weight whose batch rows do not make whole row tiles (ConvNeXt's
        # [1, 56, 56, 96] tokens: 56 rows a batch index, tiles of 14): its batch folded into
        # its rows on a device with a matrix unit, one product of [prod(batch) * M, K]. A
        # single batch dim is folded only where its rows have no divisor tile of 8 or more
        # (ViT's 197 tokens at batch 32: tiles of one row, no schedule); folding 2 x 16
        # tokens lost their operand tiles' bulk copies
        self.folded: tuple[int, ...] = ()
        products = [*cs, *([first] if first else [])]
        awkward = len(self.batch) > 1 or (self.m > 64 and divisor_tile(self.m, self.gemm_rows) < 8)
        if (target.device.mma_rows > 1 and isinstance(c.op, MatMul) and awkward and math.prod(self.batch) > 1
                and self.m % self.gemm_rows and all(x.inputs[1].type.rank == 2 and x.inputs[0].type.shape[:-2] == self.batch
                                                    for x in products)):
            self.folded = (*self.batch, self.m)
            self.batch, self.m = (), math.prod(self.folded)
        self.cols = self.n // self.groups  # the columns a column tile divides: a group's output channels

    def build(self) -> TileProgram | None:
        producer = gemm_tiles.producer_tile(self)
        if producer is not None:
            program = self._build(producer)
            if program is not None and _plain_fills(program.body):
                return program
            # an operand converted or gathered on its way to its tile: the cp.async tiles
        return self._build(None)

    def _build(self, producer: tuple[int, int] | None) -> TileProgram | None:
        """The program with ``producer``'s tile and a producer-loaded pipeline, or (None)
        the tiles ``gemm_tiles.tiles`` picks."""
        bm, bn = producer or gemm_tiles.tiles(self)
        if self.sibling_of is not None and self.n % bn:  # a column tile across two siblings
            self.sibling_of = None
            bm, bn = gemm_tiles.tiles(self)
        if producer is None:
            bn = panels.column_tile(self, bm, bn)
        packed = self.sibling_of is not None
        accs = 1 if packed else len(self.cs)  # accumulators a tile holds
        tail = self.n % bn  # the last column tile is partial: its columns clamp to the last one
        row_tail = self.m % bm  # likewise the last row tile: its rows clamp to the last row
        if (bm < 8 and self.m > 64) or (bn < 8 and self.n > 64 and self.groups == 1):
            # awkward sizes: the staged schedule handles tails (a group's columns have no
            # tail to pad; narrow tiles of it still beat the staged schedule's one thread)
            return None
        bk = min(self.k, self.tile_k)
        # A whole-row B tile is bk x N: keep it (double-buffered when pipelined) within a
        # quarter of the on-chip budget, next to the accumulator rows. The matrix unit
        # takes K steps of 16; a GPU's exact float32 product (an FMA loop) any depth:
        # LLaMA's 2048-wide rows at batch 32 needed 257 KB at K 16 in float32
        least = 4 if self.fma_loop() else 16
        while bn == self.n and bk > least and bk % 2 == 0 and bk * bn * self.op_dtype.itemsize > self.onchip // 4:
            bk //= 2
        stages = 2
        if producer:
            stages = 3
        elif bn != self.n and self.inflight:
            bk, stages = gemm_tiles.pipeline(self, bm, accs * bn, bk)
        conv = isinstance(self.c.op, Conv)
        dw_lanes = conv_rows.depthwise_lanes(self) if self.depthwise else 0
        if self.flip:  # position tiles of whole output rows of one image: no division inside
            out_rows = self.c.outputs[0].type.shape[2]
            inner = math.prod(self.c.outputs[0].type.shape[3:])
            # fewer rows a tile while the grid leaves a core idle (a 14 x 14 projection of
            # 112 channels was one tile: one of two threads worked)
            policy = self.target.conv
            positions = policy.depthwise_positions if self.depthwise and policy.depthwise_positions else 256
            want_rows = divisor_tile(out_rows, max(1, positions // inner))
            few = policy.in_place_channels
            planes = self.k * out_rows * inner * self.op_dtype.itemsize
            if (few and self.k <= policy.in_place_max_k and planes <= self.onchip // 2
                    and conv_rows.in_place(self, divisor_tile(self.cols, few))):
                # a few channels by whole planes: its epilogue, run a register block at a
                # time (codegen/cpu/block_epilogues.py), writes a few output planes each
                # as one run; every tile reads the input's planes (they stay on chip)
                bn, want_rows = divisor_tile(self.cols, few), out_rows
            lead = math.prod(self.batch) * self.groups * -(-self.cols // bn) * (self.m // (out_rows * inner))
            (tile_rows,) = fill_cores((out_rows,), [want_rows], lead, self.cores, 1)
            bm = tile_rows * inner
        # a 3 x 3 convolution by minimal filtering: its own blocks of rows and channels
        self.winograd = conv_winograd.tile(self) if self.flip else None
        if self.winograd is not None:
            bm = self.winograd.rows * math.prod(self.c.outputs[0].type.shape[3:])
            bn = self.winograd.channels
        if self.depthwise:  # a few channels per tile: the grid has tiles for every core
            bn = dw_lanes or divisor_tile(self.n, self.target.conv.depthwise_channels)
            if self.target.device.max_block_threads and len(self.c.outputs[0].type.shape) in (3, 4):
                out_rows, bn = gemm_tiles.depthwise_tile(self, self.asked_threads(0, 0))
                bm = out_rows * math.prod(self.c.outputs[0].type.shape[3:])
        self.positions_inner = conv and not self.flip and not self.depthwise and self.target.conv.positions_inner
        k_step = 0  # a convolution's K columns per step (its tile may be deeper: zero padding)
        if conv:  # K tiles hold whole channels, so im2col addressing needs no division
            taps = math.prod(self.c.inputs[1].type.shape[2:])
            cin = self.c.inputs[1].type.shape[1]
            ch_per_tile = divisor_tile(cin, max(1, self.tile_k // taps))  # no channel tail to guard
            step = 16 // math.gcd(taps, 16)  # channels that make the K tile a multiple of the MMA's k16
            if self.mma_rows > 1 and (ch_per_tile * taps) % 16 and cin % step == 0 and not self.flip:
                ch_per_tile = step * divisor_tile(cin // step, max(1, self.tile_k // (taps * step)))
            pad_group = False
            if self.groups > 1 and self.target.device.max_block_threads:
                ch_per_tile, pad_group = conv_tiles.group_k_step(self, cin, taps, bm, bn, ch_per_tile)
            bk = ch_per_tile * taps
            k_step = bk
            if pad_group or (self.mma_rows > 1 and self.op_dtype.itemsize == 2 and bk % 16 and not (self.flip or self.depthwise)
                             and gemm_weights.packs_conv_weight(self) and bm % self.mma_rows == 0 and bn % 16 == 0):
                # few input channels (a stem's 3 x 7 x 7): the K tile padded with zero columns to
                # the MMA's k16, so the product runs on tensor cores, not as an FMA loop; the
                # packed weight carries the zero rows, so its tiles stay plain copies
                bk = -(-bk // 16) * 16
            # the stages were chosen for the K depth before whole channels: keep the operand
            # tiles in flight on chip (ViT's float32 16x16 patches: K tiles of 256 taps)
            while stages > 2 and stages * (bm + bn) * bk * self.op_dtype.itemsize > self.onchip * 3 // 4:
                stages -= 1
            # float32 operand tiles of such a K depth at batch 32 (ViT's patches: 64 x 256 and
            # 256 x 128 fp32 tiles, 416 KB double-buffered): narrower tiles, as at batch 1
            # (a one-stage loop of them raced on the H200: replays differed)
            while self.mma_rows > 1 and stages * (bm + bn) * bk * self.op_dtype.itemsize + bm * bn * 4 > self.onchip:
                if bn >= bm and bn > 16 and bn % 2 == 0 and not self.depthwise and self.groups == 1:
                    bn //= 2
                elif bm > 16 and bm % 2 == 0 and not (self.flip or self.depthwise):
                    bm //= 2
                else:
                    break
        tail, row_tail = self.n % bn, self.m % bm  # (the tiles may have narrowed for the K depth)
        self.k_steps = (k_step, bk) if k_step and bk > k_step else None
        # a constant weight whose rows are not whole 16-byte vectors (GPT-2's 50257-word LM
        # head): bound padded to whole column tiles, so its tiles load as aligned rectangles
        self.pad_to = -(-self.n // bn) * bn if gemm_weights.pads_weight(self) else 0
        # on a host: the constant weight packed as panels, A's rows read in place (panels.py)
        self.panel_width = 0 if producer else panels.panel_width(self, bn)
        if self.first is not None and not self.panel_width and any(x.inputs[1].type.rank != 2 for x in (self.first, self.c)):
            return None  # a chain's weight per batch index is read only as packed panels
        if self.panel_width and conv:  # K steps of whole channels, as the im2col tile fills them
            stages = 1
            self.panel_columns, self.panel_k = -(-self.n // bn) * bn, bk
        elif self.panel_width:
            bk, stages = self.chunk or min(self.k, self.tile_k), 1
            self.panel_columns, self.panel_k = -(-self.n // bn) * bn, bk
        # a pointwise convolution read in place (below): its weight bound in row blocks of
        # the tile's rows where the target asks (row_blocks.py) and the kernels have
        # AVX-512, whose block core reads them; the AVX2 core turns each block back into
        # rows on every call (MobileNetV2's 32 -> 16 over 112 x 112: 2.45x onnxruntime's)
        self.row_blocks = (bn if self.target.conv.row_blocks and conv_rows.has_avx512(self)
                           and conv_rows.in_place_blocks(self, bn) else 0)
        params, buffers = gemm_weights.bind_params(self)
        bvars = [Var(f"b{i}") for i in range(len(self.batch))]
        mt, nt = Var("bm"), Var("bn")
        # a grid axis of one tile starts at 0: index arithmetic then simplifies (the
        # epilogue reads the tile at its own loop indices, which keeps it in registers)
        m0 = iop(IOp.MUL, mt, bm) if self.m > bm else const_index(0)
        n0 = iop(IOp.MUL, nt, bn) if self.n > bn else const_index(0)
        # a grouped convolution's tile reads its own group's input channels: those of the
        # group of its first output channel (a column tile lies inside one group)
        per_group = self.cols // bn
        group = iop(IOp.FLOORDIV, nt, per_group) if self.groups > 1 else const_index(0)
        group_channels = self.c.inputs[1].type.shape[1] if conv else self.c.inputs[0].type.shape[1] // self.groups
        self.in_channel0 = iop(IOp.MUL, group, group_channels) if self.groups > 1 or conv else const_index(0)
        per_sibling = self.n // bn
        sibling: Expr = const_index(0)
        if packed:  # column tile nt is tile nt % per_sibling of sibling nt // per_sibling
            sibling = iop(IOp.FLOORDIV, nt, per_sibling)
            n0 = iop(IOp.MUL, iop(IOp.MOD, nt, per_sibling), bn) if per_sibling > 1 else const_index(0)

        def row(i: Expr) -> Expr:
            """Row ``i`` of the tile in the product; past a partial last tile, the last row
            (recomputed and stored again with the same value, as columns are)."""
            r = iop(IOp.ADD, m0, i)
            return iop(IOp.MIN, r, self.m - 1) if row_tail else r

        clamp = [True]  # whether ``column`` clamps (off: a nest for the whole column tiles)

        def column(j: Expr) -> Expr:
            """Column ``j`` of the tile in the product; past a partial last tile, the last
            column: those lanes load and recompute it and store the same value again."""
            col = iop(IOp.ADD, n0, j)
            return iop(IOp.MIN, col, self.n - 1) if tail and clamp[0] else col

        # a convolution from its input rows copied zero-padded, its products' rows that far
        # apart in the tile (conv_rows.direct_product); else a pointwise one read in place
        wino = self.winograd
        direct = 0 if len(self.cs) > 1 or wino else conv_rows.direct_width(self, bn)
        in_place = not direct and not wino and conv_rows.in_place(self, bn)
        assert in_place or not self.row_blocks, "a weight in row blocks is read in place"
        ta = Buffer("a_tile", self.op_dtype, (bn, bk) if self.flip else (bm, bk), Scope.SHARED)
        sfx = [f"{s}" if accs > 1 else "" for s in range(accs)]
        tbs = [Buffer(f"b_tile{x}", self.op_dtype, (bk, bm) if self.flip else (bk, bn), Scope.SHARED) for x in sfx]
        dw_width = conv_rows.padded_width(self) if self.depthwise and not dw_lanes else 0
        dw_planes = bool(dw_width) and conv_rows.depthwise_planes(self)  # its sums packed as positions
        c_cols = (conv_rows.direct_length(self, bm) if direct else conv_rows.depthwise_length(self, bm) if dw_width else bm)
        # the product tile's output rows this far apart (0: packed as positions)
        pitch = direct or (conv_rows.depthwise_pitch(self) if dw_width else 0)
        # a depthwise tile in lanes whose epilogue stays there: its sums [position, channel]
        lanes_out = bool(dw_lanes) and conv_rows.lanes_epilogue(self)
        tcs = [Buffer(f"c_tile{x}", self.acc_dtype, (bm, bn) if lanes_out else (bn, c_cols) if self.flip else (bm, bn),
                      Scope.FRAGMENT) for x in sfx]
        tile_of = {id(c.outputs[0]): tcs[0 if packed else s] for s, c in enumerate(self.cs)}
        # a row reduction accumulates in its own type (a norm of an integer product's float rescale: float32)
        rows = {id(r.outputs[0]): Buffer(f"row{k}", accumulator_dtype(r.outputs[0].type.dtype), (bm,), Scope.FRAGMENT)
                for k, r in enumerate(self.reductions)}

        k0: Expr  # the K tile's first column, set with the K loop below (``read`` runs after)

        def read(v: Value, idx: Index) -> Expr:
            if id(v) in rows:  # a per-row result [..., 1]: its row in the tile
                buf = rows[id(v)]
                first = iop(IOp.ADD, iop(IOp.MUL, linearize(tuple(bvars), tuple(self.batch)), self.m), m0)
                row = iop(IOp.SUB, linearize(idx[:-1], v.type.shape[:-1]), first)
                load_r: Expr = Load(buf, (row,))
                return load_r if buf.dtype is v.type.dtype else Call(ScalarFn.CAST, (load_r,), v.type.dtype)
            if self.first is not None and v is self.first.outputs[0]:
                row = iop(IOp.SUB, linearize(idx[:-1], v.type.shape[:-1]), first_row)
                h: Expr = Load(th, (row, iop(IOp.SUB, idx[-1], k0)))
                return h if th.dtype is v.type.dtype else Call(ScalarFn.CAST, (h,), v.type.dtype)
            tc = tile_of.get(id(v))
            if tc is not None and self.flip:
                at = self._tile_at.get(tuple(idx))
                if at is None:
                    r, col = self._rows_cols(idx)
                    q = iop(IOp.SUB, r, m0)
                    if pitch:  # output rows ``pitch`` apart in the tile
                        width = self.c.outputs[0].type.shape[-1]
                        q = iop(IOp.ADD, iop(IOp.MUL, iop(IOp.FLOORDIV, q, width), pitch), iop(IOp.MOD, q, width))
                    at = (q, iop(IOp.SUB, col, n0)) if lanes_out else (iop(IOp.SUB, col, n0), q)
                load_t: Expr = Load(tc, at)
                return load_t if tc.dtype is v.type.dtype else Call(ScalarFn.CAST, (load_t,), v.type.dtype)
            if tc is not None:
                r, col = self._rows_cols(idx)
                load: Expr = Load(tc, (iop(IOp.SUB, r, m0), iop(IOp.SUB, col, n0)))
                return load if tc.dtype is v.type.dtype else Call(ScalarFn.CAST, (load,), v.type.dtype)
            return Load(buffers[id(v)], idx)

        first_row = iop(IOp.ADD, iop(IOp.MUL, linearize(tuple(bvars), tuple(self.batch)), self.m), m0)
        th = Buffer("h_tile", self.acc_dtype, (bm, bk), Scope.FRAGMENT)
        chain_allocs: tuple[Buffer, ...] = ()
        for c in self.cs:
            buffers[id(c.outputs[0])] = tile_of[id(c.outputs[0])]
        if self.first is not None:
            buffers[id(self.first.outputs[0])] = th
        for r in self.reductions:
            buffers[id(r.outputs[0])] = rows[id(r.outputs[0])]
        el = ElementBuilder(buffers, read, self.sites)
        kt = self.names.var("kt")
        k0 = iop(IOp.MUL, kt, bk)
        operands = [] if conv else [self._operands(el, tuple(bvars), c) for c in self.cs]

        def fill_a(idx: Index) -> list[Stmt]:
            col = iop(IOp.ADD, k0, idx[1])
            val = operands[0][0](row(idx[0]), col)
            return [Store(ta, idx, narrow(guard_all([iop(IOp.LT, col, self.k)] if self.k % bk else [], val, self.acc_dtype), ta.dtype))]

        weight_col0 = iop(IOp.MUL, nt, bn) if packed else n0  # this tile's first column of a bound weight

        def fill_b(b_elem, tb: Buffer):
            def fill(idx: Index) -> list[Stmt]:
                row = iop(IOp.ADD, k0, idx[0])
                if self.packed is not None:  # siblings packed or a weight padded (convolutions fill their own)
                    val = widen(Load(self.packed, (row, iop(IOp.ADD, weight_col0, idx[1]))), self.acc_dtype)
                else:
                    val = b_elem(row, column(idx[1]))
                return [Store(tb, idx, narrow(guard_all([iop(IOp.LT, row, self.k)] if self.k % bk else [], val, self.acc_dtype), tb.dtype))]

            return fill

        dw_allocs: tuple[Buffer, ...] = ()
        direct_allocs: tuple[Buffer, ...] = ()
        if wino:  # the whole K inside one statement: no K loop below
            direct_allocs, k_body = conv_winograd.product(self, buffers[id(self.c.inputs[0])], tcs[0], mt, n0, wino)
        elif in_place:  # a pointwise convolution's weight rows by its input's planes, where they lie
            k_body = [conv_rows.in_place_product(self, buffers[id(self.c.inputs[0])], tcs[0], mt, n0, kt, ch_per_tile)]
        elif dw_lanes:
            dw_allocs, k_body = conv_rows.depthwise_lanes_tile(self, el, buffers[id(self.c.inputs[0])], tcs[0], mt, n0, bm,
                                                               in_lanes=lanes_out)
        elif dw_planes:
            dw_allocs, k_body = conv_rows.depthwise_planes_tile(self, el, buffers[id(self.c.inputs[0])], tcs[0], mt, n0, bm)
        elif dw_width:
            dw_allocs, k_body = conv_rows.depthwise_padded(self, el, tcs[0], mt, n0, bm)
        elif self.depthwise:
            k_body = conv_rows.depthwise(self, el, tcs[0], mt, n0)
        elif direct:
            direct_allocs, k_body = conv_rows.direct_product(self, el, tcs[0], mt, bm, n0, kt, ch_per_tile)
        elif self.flip:
            k_body = conv_rows.fills(self, el, ta, tbs[0], mt, n0, kt, ch_per_tile)
            k_body.append(Gemm(ta, tbs[0], tcs[0], tf32=self.tf32))
        elif conv and self.panel_width:  # the im2col tile by the weight's panels
            turned_x = conv_tiles.turned_input(self, buffers.get(id(self.c.inputs[0])), ta, mt, kt, ch_per_tile)
            k_body = (turned_x if turned_x is not None
                      else conv_tiles.fills(self, el, ta, tbs[0], row, column, kt, ch_per_tile, weights=False))
            k_body.append(panels.conv_product(self, ta, tcs[0], nt, kt))
        elif conv:
            k_body = conv_tiles.fills(self, el, ta, tbs[0], row, column, kt, ch_per_tile)
            k_body.append(Gemm(ta, tbs[0], tcs[0], tf32=self.tf32))
        elif self.panel_width:
            k_body = []  # no operand tiles to fill: panels.products below
        else:  # packed siblings: one B tile and accumulator (zip stops at them)
            k_body = []
            if self.first is not None:  # this K chunk of the intermediate, on chip
                chain_allocs, h_body = self._chain_chunk(el, th, first_row, k0)
                k_body += h_body
            k_body += parallel(self.names, (bm, bk), fill_a)
            for (_, b_elem), tb, tc in zip(operands, tbs, tcs):
                k_body += [*parallel(self.names, (bk, bn), fill_b(b_elem, tb)), Gemm(ta, tb, tc, tf32=self.tf32)]
        body: list[Stmt] = [*(Fill(tc, Const(0, self.acc_dtype)) for tc in tcs)]
        if self.panel_width and not conv:  # the host's product core by packed weights: no weight tiles
            body += panels.products(self, buffers, ta, th, tcs, tuple(bvars), m0, nt, kt, fill_a)
        elif wino:
            body += k_body
        else:
            body.append(Loop(kt, -(-self.k // (k_step or bk)), LoopKind.PIPELINED, tuple(k_body), stages=stages))
        for r in self.reductions:  # in group order: a variance reads the mean before it
            body += self._row_stage(r, rows[id(r.outputs[0])], el, tuple(bvars), row, bm)
        outs = params[len(params) - len(self.group.outputs):]
        epilogues: list[list[Stmt]] = [[] for _ in self.cs] if packed else [body]
        staging: list[Buffer] = []  # outputs' staging tiles (``_staged_epilogue``)
        turned_tiles: dict[str, Buffer] = {}  # the accumulator tile turned (``_turned_epilogue``)
        for v, ob in zip(self.group.outputs, outs):
            def store(ij: Index, v: Value = v, ob: Buffer = ob) -> list[Stmt]:
                g = self._product_index(tuple(bvars), row(ij[0]), column(ij[1]))
                idx = self.fwd[id(v)](g)
                return [Store(ob, idx, el.at(v, idx))]

            out = epilogues[self.sibling_of[id(v)] if packed else 0]  # type: ignore[index]
            if lanes_out:
                out += conv_rows.lanes_stores(self, el, v, ob, tcs[0], mt, n0, bm)
            elif self.flip:
                out += conv_rows.stores(self, el, v, ob, mt, n0, bn, bm, pitch)
            elif self._rows_innermost(v, bvars, row, column):  # e.g. K written transposed for attention
                acc = tcs[0] if len(tcs) == 1 else None
                turned = self._turned_epilogue(store, bm, bn, acc, turned_tiles) if acc is not None else None
                staged = None if turned is not None else self._staged_epilogue(ob, store, bm, bn, len(staging))
                if turned is not None:
                    out += turned
                elif staged is not None:
                    staging.append(staged[0])
                    out += staged[1]
                else:
                    out += parallel(self.names, (bn, bm), lambda ji, store=store: store((ji[1], ji[0])))
            elif tail and self.n > bn and self.panel_width and not packed and not self.target.device.max_block_threads:
                # a host's product by packed weight panels with a partial last column tile
                # (an LM head's 50257 words): the whole tiles store without the clamp, as
                # runs; the last one clamped (GPT-2's head spent 12 of 104 ms on the
                # clamped copy, 3.5 on runs)
                clamp[0] = False
                whole = parallel(self.names, (bm, bn), store)
                clamp[0] = True
                last = -(-self.n // bn) - 1
                out += [If(iop(IOp.LT, nt, last), tuple(whole)),
                        If(iop(IOp.GE, nt, last), tuple(parallel(self.names, (bm, bn), store)))]
            else:
                out += parallel(self.names, (bm, bn), store)
        if packed:  # each column tile runs its own sibling's epilogue
            body += [If(iop(IOp.EQ, sibling, s), tuple(e)) for s, e in enumerate(epilogues) if e]
        grid = tuple(self.batch) + (-(-self.m // bm), len(self.cs) * self.n // bn if packed else -(-self.n // bn))
        wide = f", {len(self.cs)} sibling products sharing the A tile" if len(self.cs) > 1 else ""
        if packed:
            wide = (f", {len(self.cs)} sibling products as one of their weights packed [{self.k}, {len(self.cs) * self.n}]"
                    f" (each column tile runs its sibling's epilogue)")
        if self.first is not None:
            wide = f", the first product of a chain computed {bk} columns at a time on chip"
        if dw_width:
            wide += f", input rows zero-padded to {dw_width} on chip, every tap summed per position"
        if dw_lanes:
            wide += f", {dw_lanes} channels in vector lanes over a zero-padded grid of the input rows"
            if lanes_out:
                wide += ", the epilogue in the lanes, the tile stored by a transpose"
        if in_place:
            wide += ", the weight's rows by the input's channel planes where they lie (no operand tiles)"
        if wino:
            wide += conv_winograd.describe(wino)
        if direct:
            wide += f", input rows copied zero-padded to {direct} per K step, a product row per channel and tap (no im2col)"
        if self.groups > 1:
            wide += f", {self.groups} groups of {self.cols} output channels"
        if tail:
            wide += f", last column tile {tail} wide"
        if row_tail:
            wide += f", last row tile {row_tail} high"
        notes = (f"gemm+epilogue: tiles {bm}x{bn}x{bk}, grid {grid}{wide}, {stages}-stage K loop",)
        if wino:  # (its K is the statement's: no K loop)
            notes = (f"gemm+epilogue: tiles {bm}x{bn}, grid {grid}{wide}",)
        elif self.panel_width:
            notes = (f"gemm+epilogue: tiles {bm}x{bn}, grid {grid}{wide}, the weight packed in {self.panel_width}-column panels, "
                     f"A read in place, K in blocks of {bk}",)
        n_in = len(params) - len(self.group.outputs)
        operand_tiles = (() if self.depthwise or in_place or direct or wino or (self.panel_width and self.first is None and not conv)
                         else (ta,) if self.panel_width else (ta, *tbs))
        allocs = (*operand_tiles, *dw_allocs, *direct_allocs, *tcs, *rows.values(), *((th, *chain_allocs) if self.first is not None else ()),
                  *staging, *turned_tiles.values())
        # two warpgroups for 128 rows of at least 128 accumulator columns (siblings together)
        threads = self.asked_threads(bm, accs * bn)
        if producer:
            notes = (notes[0] + ", operand tiles loaded by a producer warp",)
        schedule = GemmSchedule(
            batch=tuple(self.batch), m=self.m, n=self.n, k=self.k, tile_m=bm, tile_n=bn, tile_k=bk, threads=threads,
            stages=stages, products=len(self.cs), packed_siblings=packed, chain=self.first is not None,
            whole_rows=bool(self.reductions) or self.first is not None, producer=producer is not None,
            channel_rows=self.flip, depthwise=self.depthwise, channels_per_k_tile=ch_per_tile if conv else 0,
            padded_columns=self.pad_to, accumulator=self.acc_dtype, operands=self.op_dtype, tf32=self.tf32, occupancy=0,
            positions_inner=self.positions_inner, groups=self.groups, panel_width=self.panel_width,
            depthwise_padded_width=0 if dw_planes else dw_width, depthwise_planes=dw_planes, depthwise_lanes=dw_lanes,
            operands_in_place=in_place, direct_padded_width=direct,
            winograd=WINOGRAD_TILE if wino else 0)
        order = self._host_order(grid)
        if order:
            notes = (notes[0] + ", column tiles outermost on a host (each weight panel read once)",)
        return TileProgram(self.name, tuple(params), n_in, grid, (*bvars, mt, nt), threads, allocs, tuple(body), notes,
                           producer=producer is not None, schedule=schedule, host_order=order)

    def _host_order(self, grid: tuple[int, ...]) -> tuple[int, ...]:
        """On a host, a product by packed constant weights larger than its A operand
        nests its column tiles outside its row tiles: the row tiles of one weight panel
        then run one after the other, the panel still in the core's cache, and a static
        schedule gives each thread its own columns, so the weights come from memory once
        (bert-base's QKV projection at 128 tokens, 2 row tiles: 7 MB of weights, read
        twice the other way round). Empty (the grid's order) otherwise."""
        rows, cols = grid[-2], grid[-1]
        if not self.panel_width or self.first is not None or rows < 2 or cols < 2 \
                or isinstance(self.cs[0].op, (Conv, ConvTranspose)):
            return ()
        if self.k * self.n * len(self.cs) <= self.m * self.k:
            return ()
        lead = len(grid) - 2
        return (*range(lead), lead + 1, lead)

    def asked_threads(self, bm: int, columns: int) -> int:
        """Threads a tile of ``bm`` rows and ``columns`` accumulator columns asks for: two
        warpgroups for 128 rows of at least 128 columns (siblings together), else one."""
        return self.max_threads if bm >= 128 and columns >= 128 else 128

    def _turned_epilogue(self, store: Callable[[Index], list[Stmt]], bm: int, bn: int, tc: Buffer,
                         turned: dict[str, Buffer]) -> list[Stmt] | None:
        """On a host (``GemmPolicy.turned_epilogue``), an output stored across the tile: the
        float32 accumulator tile turned by the host's block transpose into the store's
        order (once, for every such output: ``turned``), then the epilogue computed in the
        store's order reading it, and any residual, as runs: vector math, no strided
        reads. None where the policy is off or the tile is not float32."""
        if not self.target.gemm.turned_epilogue or self.target.device.max_block_threads or tc.dtype is not DType.FLOAT32:
            return None
        head: list[Stmt] = []
        ct = turned.get(tc.name)
        if ct is None:
            ct = turned[tc.name] = Buffer(f"t_{tc.name}", DType.FLOAT32, (bn, bm), Scope.FRAGMENT)
            zero = const_index(0)
            head.append(Transpose(Region(tc, (zero, zero), (bm, bn)), Region(ct, (zero, zero), (bn, bm))))

        def turned_store(ji: Index) -> list[Stmt]:
            return [replace(x, value=_reading_turned(x.value, tc, ct),
                            indices=tuple(_reading_turned(e, tc, ct) for e in x.indices)) if isinstance(x, Store) else x
                    for x in store((ji[1], ji[0]))]
        return [*head, *parallel(self.names, (bn, bm), turned_store)]

    def _staged_epilogue(self, ob: Buffer, store: Callable[[Index], list[Stmt]], bm: int, bn: int,
                         k: int) -> tuple[Buffer, list[Stmt]] | None:
        """On a host, an output stored across the tile whose epilogue calls a costly
        function (``GemmPolicy.staged_epilogue_flops``) or selects (``staged_epilogue_selects``):
        its staging tile, and the two nests that compute the epilogue in the tile's order
        (columns innermost: the accumulator read in place, the math in whole vectors) and
        copy it out in the store's order; None to store it as it is computed."""
        policy = self.target.gemm
        if not (policy.staged_epilogue_flops or policy.staged_epilogue_selects) or self.target.device.max_block_threads:
            return None
        def stores(ij: Index) -> list[Store]:
            return [s for s in store(ij) if isinstance(s, Store)]

        calls = [x.fn for s in stores((Var("_i"), Var("_j"))) for x in subexpressions(s.value) if isinstance(x, Call)]
        costly = policy.staged_epilogue_flops and max((fn.value.flops for fn in calls), default=0) >= policy.staged_epilogue_flops
        selects = policy.staged_epilogue_selects and any(fn in _SELECTS for fn in calls)
        if not (costly or selects):
            return None
        et = Buffer(f"e_tile{k}", ob.dtype, (bm, bn), Scope.FRAGMENT)
        compute = parallel(self.names, (bm, bn), lambda ij: [Store(et, ij, s.value) for s in stores(ij)])
        copy = parallel(self.names, (bn, bm), lambda ji: [Store(s.buffer, s.indices, Load(et, (ji[1], ji[0])))
                                                           for s in stores((ji[1], ji[0]))])
        return et, [*compute, *copy]

    def _rows_innermost(self, v: Value, bvars, row, column) -> bool:
        """Whether output ``v``'s last (contiguous) axis runs along the tile's rows, not
        its columns: then its store nest puts the rows innermost, so neighbouring threads
        write neighbouring elements."""
        i, j = Var("_row"), Var("_col")
        last = self.fwd[id(v)](self._product_index(tuple(bvars), row(i), column(j)))[-1]
        mentions = var_ids(last)
        return id(i) in mentions and id(j) not in mentions

    def _chain_chunk(self, el: ElementBuilder, th: Buffer, first_row: Expr, k0: Expr) -> tuple[tuple[Buffer, ...], list[Stmt]]:
        """The first product of a chain for this tile's rows and the columns [k0, k0 + bk)
        of the intermediate: its own K loop of Gemms into the h tile."""
        c1 = self.first
        assert c1 is not None
        x, w = c1.inputs
        dt = self.acc_dtype
        bm, bk = th.shape
        k1 = x.type.shape[-1]
        bk1 = min(k1, self.tile_k)
        tx = Buffer("x_tile", self.op_dtype, (bm, bk1), Scope.SHARED)
        tw = Buffer("w1_tile", self.op_dtype, (bk1, bk), Scope.SHARED)
        jt = self.names.var("jt")
        j0 = iop(IOp.MUL, jt, bk1)
        tail = k1 % bk1 != 0

        def fill_x(idx: Index) -> list[Stmt]:
            col = iop(IOp.ADD, j0, idx[1])
            row = delinearize(iop(IOp.ADD, first_row, idx[0]), x.type.shape[:-1])
            val = widen(el.at(x, (*row, col)), dt)
            return [Store(tx, idx, narrow(guard_all([iop(IOp.LT, col, k1)] if tail else [], val, dt), tx.dtype))]

        def fill_w(idx: Index) -> list[Stmt]:
            row = iop(IOp.ADD, j0, idx[0])
            val = widen(el.at(w, (row, iop(IOp.ADD, k0, idx[1]))), dt)
            return [Store(tw, idx, narrow(guard_all([iop(IOp.LT, row, k1)] if tail else [], val, dt), tw.dtype))]

        body = (*parallel(self.names, (bm, bk1), fill_x), *parallel(self.names, (bk1, bk), fill_w), Gemm(tx, tw, th, tf32=self.tf32))
        return (tx, tw), [Fill(th, Const(0, dt)), Loop(jt, -(-k1 // bk1), LoopKind.PIPELINED, body, stages=2)]

    def _row_stage(self, r: Node, buf: Buffer, el: ElementBuilder, bidx: Index, row: Callable[[Expr], Expr],
                   bm: int) -> list[Stmt]:
        """One reduction over the tile's whole rows into a per-row buffer (``row``: the
        product's row of a tile row, the last one past a partial last tile)."""
        op: Reduce = r.op  # type: ignore[assignment]
        x = r.inputs[0]
        i, j = self.names.var("r"), self.names.var("c")
        val = el.at(x, self.fwd[id(x)](self._product_index(bidx, row(i), j)))
        if x.type.dtype is not buf.dtype:
            val = Call(ScalarFn.CAST, (val,), buf.dtype)
        step = Store(buf, (i,), Call(COMBINE[op.fn], (Load(buf, (i,)), val), buf.dtype))
        return [Loop(i, bm, LoopKind.PARALLEL, (
            Store(buf, (i,), identity(op.fn, buf.dtype)),
            Loop(j, self.n, LoopKind.SERIAL, (step,)),
        ))]

    def fma_loop(self) -> bool:
        """A GPU product that no matrix unit takes (float32 not rounded to TF32): an exact
        FMA loop, of any K step, whose accumulator the device passes keep in registers up
        to ``fma_registers`` elements a thread (tile_ir/passes/placement.py)."""
        return self.mma_rows > 1 and self.op_dtype not in HALF_FLOATS and not self.tf32

    def _product_index(self, bidx: Index, row: Expr, col: Expr) -> Index:
        """The product's own index for GEMM row/column (a conv's rows are positions)."""
        if isinstance(self.c.op, MatMul):
            return (*delinearize(row, self.folded), col) if self.folded else bidx + (row, col)
        out = self.c.outputs[0].type.shape
        n, *o = delinearize(row, (out[0], *out[2:]))
        return (n, col, *o)

    def _rows_cols(self, idx: Index) -> tuple[Expr, Expr]:
        if isinstance(self.c.op, MatMul):
            return (linearize(idx[:-1], self.folded), idx[-1]) if self.folded else (idx[-2], idx[-1])
        out = self.c.outputs[0].type.shape
        return linearize((idx[0], *idx[2:]), (out[0], *out[2:])), idx[1]

    def _operands(self, el: ElementBuilder, bidx: Index, c: Node):
        """(a_elem, b_elem): a product's operand elements at (row, K) and (K, column), for
        products whose tiles are filled element by element (a Conv fills its own tiles:
        ``conv_tiles``, ``conv_rows``)."""
        dt = self.acc_dtype
        a, b = c.inputs
        if isinstance(c.op, ConvTranspose):
            return conv_tiles.transposed_operands(self, el, c)
        if self.folded:  # a row of the folded product is (batch..., row) of A; B is 2-D
            return (lambda r, k: widen(el.at(a, (*delinearize(r, self.folded), k)), dt),
                    lambda k, col: widen(el.at(b, (k, col)), dt))
        ab = broadcast_index(bidx, a.type.shape[:-2], self.batch)
        bb = broadcast_index(bidx, b.type.shape[:-2], self.batch)
        return (lambda r, k: widen(el.at(a, ab + (r, k)), dt), lambda k, col: widen(el.at(b, bb + (k, col)), dt))

def _plain_fills(body: Sequence[Stmt]) -> bool:
    """Every store of a pipelined K loop copies a global element into its tile as it is
    (a producer's bulk copies can do nothing else)."""
    loops = [s for s in body if isinstance(s, Loop) and s.kind is LoopKind.PIPELINED]
    return all(isinstance(st.value, Load) and st.value.buffer.scope is Scope.GLOBAL and st.value.buffer.dtype is st.buffer.dtype
               for loop in loops for st in statements(loop.body) if isinstance(st, Store))
