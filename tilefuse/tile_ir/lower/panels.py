"""A host's product by a constant weight: the weight packed as panels, A read in place.

On a CPU (``GemmPolicy.panel_width``) a plain float32 product ``A @ W`` whose ``W`` is a
constant [K, N] matrix that only this product reads is not tiled through operand tiles:
``W`` is bound packed at compile time, ``[P, K, width]`` with P panels of ``width``
columns each (zero columns past N, to whole column tiles), and each product tile is one
``PanelGemm`` that reads its rows of A where they lie and streams its panels through the
host's product core (``codegen/cpu/prelude.py``). Copying operand tiles cost the plain
schedule a third of its time at bert-base sizes, and unpacked rows of W are read 3 KB
apart; a panel's K step is two contiguous 64-byte rows.

Sibling products (Q, K and V of one input) each read their own panels by the same rows
of A. A weight chain (an MLP: ``act(x @ W1 + b1) @ W2``) walks the intermediate's
columns a K chunk at a time: the chunk of ``x @ W1`` by W1's panels, the second
product's A tile computed from it on chip, then by the chunk's rows of W2's panels.
A product whose A is computed on the way (a cast, a transpose, a prologue inside the
group) keeps its operand tiles: only a kernel input, read as it is, is read in place.
A convolution with positions as rows (small maps) is the exception: its weight, as the
implicit GEMM's [K, Cout] matrix, is packed the same way, and its im2col tile, filled
per K step, is the A the panel core reads on chip (``conv_product``).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import numpy as np

from tilefuse import cpu_isa
from tilefuse.ir.dtypes import DType
from tilefuse.ir.graph import Node, Value
from tilefuse.ir.prims import Conv, Map, MatMul, ScalarFn
from tilefuse.tile_ir.ir import Buffer, Const, Expr, Fill, IOp, Loop, LoopKind, PanelGemm, Region, Stmt, Var, const_index, iop
from tilefuse.tile_ir.lower import gemm_weights
from tilefuse.tile_ir.lower.common import parallel
from tilefuse.tile_ir.lower.elements import Index, broadcast_index

if TYPE_CHECKING:
    from tilefuse.tile_ir.lower.gemm_epilogue import _Builder

INT8_GROUP = 4  # K values an int8 panel keeps together a column (a 32-bit lane of u8 x s8 dot products)


def column_tile(b: "_Builder", bm: int, bn: int) -> int:
    """``bn`` as whole panels where ``b``'s product takes them: the tile of whole panels
    nearest ``bn`` (from half of it to half as much again) that divides N, so that no
    tile computes columns past it (MobileNetV2's 960 channels: 96, not 120 rounded up to
    128, whose last tile computed 64 clamped columns again); else ``bn`` rounded up
    (columns past N in the last tile are the packed weight's zeros, clamped in the
    epilogue as any tail): a 1000-class head's divisor tile of 50 becomes 64, not
    operand tiles. Where that tile leaves a partial last one, or a grid of ``bm``-row
    tiles that some cores get more of than others, the width of whole panels whose grid
    costs least (``_grid_cost``; the nearest on a tie) instead, its accumulators within
    ``GemmPolicy.panel_grid_bytes``: MobileNetV2's 960 -> 320 at 7 x 7 took 5 tiles of 64
    columns (3 on one core of two), now 2 of 160; its 960 -> 160 took 2 of 96, 192
    columns, now 96 and a last one of 64 (``PanelGemm.columns``)."""
    width = takes_panels(b)
    if not width:
        return bn
    tile = bn
    if bn % width:
        whole = [t for t in range(width, b.n + 1, width) if b.n % t == 0 and bn // 2 <= t <= bn + bn // 2]
        tile = min(whole, key=lambda t: (abs(t - bn), -t)) if whole else -(-bn // width) * width
    lead = math.prod(b.batch) * -(-b.m // bm)
    policy = b.target.gemm
    if (not policy.panel_grid_bytes or b.reductions or b.first is not None
            or (b.n % tile == 0 and lead * (b.n // tile) % b.cores == 0)):
        return tile  # whole rows (a row reduction's, a chain's); or whole tiles, as many for every core
    most = policy.panel_grid_bytes // (max(1, len(b.cs)) * bm * b.acc_dtype.itemsize) // width * width
    widths = range(width, max(tile, min(most, -(-b.n // width) * width)) + 1, width)
    own = policy.panel_fill_columns if isinstance(b.c.op, Conv) else 0  # a MatMul reads A in place
    return min(widths, key=lambda t: (_grid_cost(b.n, width, t, lead, b.cores, own), abs(t - tile)))


def _grid_cost(n: int, width: int, tile: int, lead: int, cores: int, own: int) -> int:
    """Columns (each tile's, plus ``own``) the busiest core computes in a grid of
    ``lead`` x column tiles of ``tile`` over ``n`` (the last one ending at the panel
    holding column n - 1), shared as OpenMP's static schedule does (contiguous runs,
    one more for the first ``tiles % cores`` cores), times the cores, plus all of them:
    one core's time and the other cores' idle, weighed with the whole work (one thread
    runs them all)."""
    padded = -(-n // width) * width
    per_row = [min(tile, padded - j) + own for j in range(0, padded, tile)]
    loads = per_row * lead
    q, r = divmod(len(loads), cores)
    busiest, start = 0, 0
    for core in range(cores):
        count = q + (core < r)
        busiest = max(busiest, sum(loads[start:start + count]))
        start += count
    return cores * busiest + sum(loads)


def partial_columns(b: "_Builder", column_tile: Var, bn: int) -> Expr | None:
    """The columns a product tile computes where the last column tile is partial (whole
    panels, up to the one holding column N - 1): ``min(bn, padded - tile * bn)``; None
    where every tile is whole, or the last one's panels fill it."""
    padded = -(-b.n // b.panel_width) * b.panel_width
    if b.n <= bn or padded % bn == 0:
        return None
    return iop(IOp.MIN, const_index(bn), iop(IOp.SUB, const_index(padded), iop(IOp.MUL, column_tile, bn)))


def panel_width(b: "_Builder", bn: int) -> int:
    """The panels' width for ``b``'s products in column tiles of ``bn``: ``takes_panels``,
    where the column tiles are whole panels; else 0."""
    width = takes_panels(b)
    return width if width and bn % width == 0 else 0


def takes_panels(b: "_Builder") -> int:
    """The policy's panel width where ``b``'s products can read packed panels, else 0:
    not a host target; not float32 MatMuls (convolutions); a weight that is not a
    constant 2-D float32 matrix read by its product alone; an A read in place (the
    products' shared one, or a chain's input) that the group computes; a chain's K
    chunks that are not whole panels."""
    width = b.target.gemm.panel_width
    if not width or b.target.device.max_block_threads or b.folded or b.sibling_of is not None:
        return 0
    if isinstance(b.c.op, Conv):
        return width if _conv_takes_panels(b) else 0
    products = [*b.cs, *([b.first] if b.first is not None else [])]
    if not all(isinstance(c.op, MatMul) for c in products):
        return 0
    if {b.acc_dtype, b.op_dtype} == {DType.INT32}:
        return width if integer_rows(b) is not None else 0
    if {b.acc_dtype, b.op_dtype} != {DType.FLOAT32}:
        return 0
    for c in products:
        w = c.inputs[1]
        if not (w.is_constant and w.type.dtype is DType.FLOAT32 and weight_batch(b, w) is not None):
            return 0
        if sum(x is w for n in b.group.nodes for x in n.inputs) != 1:
            return 0
    a = (b.first or b.c).inputs[0]
    if any(c.inputs[0] is not b.c.inputs[0] for c in b.cs) or a.type.dtype is not DType.FLOAT32:
        return 0
    if not any(x is a for x in b.group.inputs) or (b.first is not None and min(b.k, b.tile_k) % width):
        return 0
    return width


def integer_rows(b: "_Builder") -> Value | None:
    """The uint8 kernel input whose rows an integer product reads in place, where ``b``'s
    products are ``cast<int32>(x) @ W`` (``frontend/qdq.py``, ``MatMulInteger`` by a
    constant) for a uint8 input ``x`` they share and constant weights of int8 values,
    each read by its product alone (packed as integer panels, ``integer_panels``;
    codegen/cpu/prelude.py's u8 x s8 cores); else None."""
    if b.first is not None:
        return None
    a = b.c.inputs[0]
    if any(c.inputs[0] is not a for c in b.cs) or a.producer is None:
        return None
    cast = a.producer
    if not (isinstance(cast.op, Map) and cast.op.fn is ScalarFn.CAST and cast in b.group.nodes):
        return None
    x = cast.inputs[0]
    if x.type.dtype is not DType.UINT8 or not any(x is v for v in b.group.inputs) or x.type.shape != a.type.shape:
        return None
    for c in b.cs:
        w = weight_of(c)
        if w.data is None or w.type.rank != 2 or (w.data.size and (w.data.min() < -128 or w.data.max() > 127)):
            return None
        if sum(y is w for n in b.group.nodes for y in n.inputs) != 1:
            return None
        if w is not c.inputs[1] and sum(y is c.inputs[1] for n in b.group.nodes for y in n.inputs) != 1:
            return None
    return x


def weight_of(c: Node) -> Value:
    """The constant a product's weight is bound from: the weight itself, or for an
    integer product whose int8 weight the group widens (``cast<int32>(W)``, left unfolded
    as 4x the bytes), ``W``."""
    w = c.inputs[1]
    cast = w.producer
    if (w.data is None and cast is not None and isinstance(cast.op, Map) and cast.op.fn is ScalarFn.CAST
            and cast.inputs[0].data is not None and cast.inputs[0].type.dtype is DType.INT8):
        return cast.inputs[0]
    return w


def _conv_takes_panels(b: "_Builder") -> bool:
    """A float32 convolution with positions as rows (not channels, not depthwise, one
    group, alone in its group's product): its weight, as the [K, Cout] matrix of the
    implicit GEMM, packed as panels; A stays its im2col tile, filled per K step as
    before, and is read by the panel core where it lies on chip."""
    w = b.c.inputs[1]
    return (len(b.cs) == 1 and b.first is None and not b.flip and not b.depthwise and b.groups == 1
            and {b.acc_dtype, b.op_dtype} == {DType.FLOAT32} and w.is_constant and w.type.dtype is DType.FLOAT32
            and gemm_weights.packs_conv_weight(b))


def weight_batch(b: "_Builder", w: Value) -> int | None:
    """How many [K, N] matrices a product's weight ``w`` holds: 1 for a matrix; for a
    ``[B, K, N]`` weight of a product batched as ``[B, M, N]`` (a chain split along its
    hidden dim, ``partition/split_chains.py``), B, one matrix a batch index; None for
    any other rank (not packed)."""
    if w.type.rank == 2:
        return 1
    if w.type.rank == 3 and len(b.batch) == 1 and w.type.shape[0] == b.batch[0]:
        return b.batch[0]
    return None


def matrix(b: "_Builder", w: Value) -> np.ndarray:
    """The [K, N] matrix the panels of weight ``w`` pack (``[B, K, N]``: one a batch
    index): a MatMul's weight as it is, a convolution's [Cout, Cin, *taps] as K =
    (Cin, *taps) rows of its Cout columns (the order of the im2col tile's columns)."""
    data = w.data
    assert data is not None
    if isinstance(b.c.op, Conv):
        return np.ascontiguousarray(data.reshape(w.type.shape[0], -1).T)
    return data


def conv_product(b: "_Builder", a_tile: Buffer, c_tile: Buffer, column_tile: Var, kt: Var) -> PanelGemm:
    """A convolution's K step: its im2col tile (filled before) by the step's rows of the
    weight's panels."""
    bm, bn = c_tile.shape
    first_panel = iop(IOp.MUL, column_tile, bn // b.panel_width) if b.n > bn else const_index(0)
    bk = a_tile.shape[1]
    return PanelGemm(Region(a_tile, (const_index(0), const_index(0)), a_tile.shape), b.panel_bufs[id(b.c.inputs[1])],
                     first_panel, iop(IOp.MUL, kt, bk), c_tile, bk, partial_columns(b, column_tile, bn))


def columns(b: "_Builder", w: Value) -> int:
    """The columns ``w`` is packed to (whole column tiles: a chain's first weight, K
    chunks), or 0 if it is no product's weight."""
    if b.first is not None and w is b.first.inputs[1]:
        return -(-b.k // b.panel_k) * b.panel_k
    return b.panel_columns if any(w is weight_of(c) for c in b.cs) else 0


def integer_panels(b: "_Builder") -> DType:
    """How an integer product's int8 weight values are stored in its panels: as int8
    where the kernels are built with AVX-512 VNNI (vpdpbusd takes them so), else widened
    to int16, which the core without VNNI multiplies as they are (vpmaddwd; widening
    both operands in its loop took 1.6x as long: NOTES.md, session 37). The prelude picks
    its core by the panels' type, so either runs on any host; this only chooses the
    faster one for the kernels' instruction-set level."""
    return DType.INT8 if cpu_isa.has(cpu_isa.target_level(b.target), "avx512f", "avx512_vnni") else DType.INT16


def pack(weight: np.ndarray, width: int, columns: int, integer: DType | None = None) -> np.ndarray:
    """``weight`` [K, N] as panels [columns / width, K, width], zero past column N
    (``[B, K, N]``: B such runs of panels, ``[B * columns / width, K, width]``). An
    integer product's weight (int8 values held as int32) packs as panels of groups of 4
    rows stored as ``integer`` (int8 or int16, ``integer_panels``), ``[columns / width,
    ceil(K / 4), width * 4]``: element (p, j) at ``[j // width, p // 4, (j % width) * 4 +
    p % 4]``, zero rows past K, so one lane of 4 values holds a column's 4 consecutive K
    values (what one VNNI dot-product step takes)."""
    if weight.ndim == 3:  # one matrix a batch index: their panels one after another
        return np.concatenate([pack(m, width, columns, integer) for m in weight])
    k, n = weight.shape
    if integer is not None:
        groups = -(-k // INT8_GROUP)
        padded = np.zeros((groups * INT8_GROUP, columns), integer.numpy)
        padded[:k, :n] = weight
        # [groups, 4, P, width] -> [P, groups, width, 4]
        quads = padded.reshape(groups, INT8_GROUP, columns // width, width).transpose(2, 0, 3, 1)
        return np.ascontiguousarray(quads.reshape(columns // width, groups, width * INT8_GROUP))
    padded = np.zeros((k, columns), weight.dtype)
    padded[:, :n] = weight
    return np.ascontiguousarray(padded.reshape(k, columns // width, width).transpose(1, 0, 2))


def products(b: "_Builder", buffers: dict[int, Buffer], a_tile: Buffer, h_tile: Buffer, c_tiles: list[Buffer],
             bvars: tuple[Expr, ...], m0: Expr, column_tile: Var, kt: Var,
             fill_a: Callable[[Index], list[Stmt]]) -> list[Stmt]:
    """The tile's products after its accumulators' fills. Siblings: each one's panels by
    the shared rows of A, read in place. A chain, K chunk by chunk: the first product's
    chunk by its panels into the h tile, the A tile computed from it (the fill the
    operand-tile schedule has too), then the chunk's rows of the second weight's panels."""
    bm, bn = c_tiles[0].shape
    first_panel = iop(IOp.MUL, column_tile, bn // b.panel_width) if b.n > bn else const_index(0)
    bk = b.panel_k  # the K block of the products (and a chain's K chunk: the h tile's columns)

    def panel0(w: Value, first: Expr) -> Expr:
        """``first`` panel of the tile's batch index's matrix of ``w`` (one a batch index
        for a ``[B, K, N]`` weight, each ``columns`` wide)."""
        if w.type.rank == 2:
            return first
        return iop(IOp.ADD, iop(IOp.MUL, bvars[0], columns(b, w) // b.panel_width), first)

    if b.first is None:
        a = integer_rows(b) if b.acc_dtype is DType.INT32 else b.c.inputs[0]
        assert a is not None
        rows = _rows(b, buffers[id(a)], bvars, m0, bm)
        computed = partial_columns(b, column_tile, bn)
        return [PanelGemm(rows, b.panel_bufs[id(weight_of(c))], panel0(weight_of(c), first_panel), const_index(0), tc, bk,
                          computed) for c, tc in zip(b.cs, c_tiles)]
    x, w1 = b.first.inputs
    k1 = x.type.shape[-1]
    w2 = b.c.inputs[1]
    chunk = PanelGemm(_rows(b, buffers[id(x)], bvars, m0, bm), b.panel_bufs[id(w1)],
                      panel0(w1, iop(IOp.MUL, kt, bk // b.panel_width)), const_index(0), h_tile, min(k1, b.tile_k))
    second = PanelGemm(Region(a_tile, (const_index(0), const_index(0)), a_tile.shape), b.panel_bufs[id(w2)],
                       panel0(w2, first_panel), iop(IOp.MUL, kt, bk), c_tiles[0], bk)
    body = (Fill(h_tile, Const(0, h_tile.dtype)), chunk, *parallel(b.names, (bm, bk), fill_a), second)
    return [Loop(kt, -(-b.k // bk), LoopKind.SERIAL, body)]


def _rows(b: "_Builder", a_param: Buffer, bvars: tuple[Expr, ...], m0: Expr, bm: int) -> Region:
    """The tile's rows of the kernel input ``a_param`` (batch indices broadcast as the
    product's), all its columns."""
    lead = a_param.shape[:-2]
    batch = broadcast_index(bvars, lead, b.batch)
    return Region(a_param, (*batch, m0, const_index(0)), (*(1 for _ in lead), bm, a_param.shape[-1]))
