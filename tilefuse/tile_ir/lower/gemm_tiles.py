"""Tile edges, K depth and stages of a gemm+epilogue kernel: how big its tiles are.

The gemm+epilogue builder (``gemm_epilogue._Builder``) asks these once per kernel, from
the product's extents and the target's gemm policy and device: the large producer-loaded
tile where a plain half-float product has K steps to amortise it, else tiles that divide
the product (or a grouped convolution's group), fit the accumulator budget, give every
core a tile and take the matrix unit's power-of-two layouts; then the K depth and
pipeline stages within the bytes the target keeps in flight.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tilefuse.ir.dtypes import HALF_FLOATS
from tilefuse.ir.prims import Conv, ConvTranspose, MatMul
from tilefuse.chain_rows import chain_tiles
from tilefuse.tile_ir.lower import gemm_weights, panels
from tilefuse.tile_ir.lower.common import divisor_tile, fill_cores, halve_while_idle
from tilefuse.tile_ir.passes import DeviceOptions

if TYPE_CHECKING:
    from tilefuse.tile_ir.lower.gemm_epilogue import _Builder


def producer_tile(b: "_Builder") -> tuple[int, int] | None:
    """The target's large tile for a large plain product: a MatMul (no convolution, no
    epilogue row reduction, no chain, not packed siblings) of half-float operands that
    splits into whole tiles, with enough K steps per core to amortise the pipeline."""
    steps = b.target.gemm.producer_steps
    bm, bn = b.target.gemm.producer_tile
    if not steps or not isinstance(b.c.op, MatMul) or len(b.cs) > 1 or b.reductions or b.first is not None:
        return None
    if b.op_dtype not in HALF_FLOATS or b.m % bm or b.n % bn or gemm_weights.pads_weight(b):
        return None
    tiles = math.prod(b.batch) * (b.m // bm) * (b.n // bn)
    return (bm, bn) if tiles * (b.k // b.tile_k) >= steps * b.cores else None


def tiles(b: "_Builder") -> tuple[int, int]:
    """Row and column edges of a product tile, before the K loop's. A grouped
    convolution's column tiles divide a group's output channels (``b.cols``), each
    group a run of column tiles of the grid."""
    cols = b.cols
    channels = b.target.conv.channel_tile if isinstance(b.c.op, Conv) and not b.depthwise else 0
    bm, bn = divisor_tile(b.m, b.gemm_rows), divisor_tile(cols, channels or b.gemm_tile)
    if b.reductions or b.first is not None:  # whole rows on the tile: rows of all N columns
        bm = divisor_tile(b.m, b.row_tile)
        if b.mma_rows > 1 and b.first is None and b.m > 16 and (bm & (bm - 1) or bm < b.mma_rows):
            # rows with no power-of-two divisor (Whisper's 1500 frames: tiles of 15 rows, 64
            # threads, FMA loops unrolled into a 2.9 MB cubin; a prime count fell through to
            # the staged schedule): power-of-two tiles, halved
            # while the grid leaves cores idle, the last one partial (its rows clamped)
            bm = halve_while_idle(b.m, b.row_tile, math.prod(b.batch), b.cores, max(b.min_tile, b.mma_rows))
        elif _host_row_tail(b) and (bm < 16 or b.m // bm * math.prod(b.batch) > b.cores):
            # on a host: as few row tiles as give each core its share (a multiple of the
            # cores) and fit the core's cache (every tile walks every weight panel: ViT's
            # 197 tokens in 4 tiles of 50 read each layer's MLP weights 4 times, in 2 tiles
            # of 99 twice; a 1-row tile was refused: the staged schedule's one thread). A
            # chain only where its input is read in place (panels.py clamps the rows it
            # reads), not through an x tile
            bm = _host_whole_rows(b)
        most = DeviceOptions.of(b.target.codegen).fma_registers
        if most and b.fma_loop():
            # an exact product's accumulator in registers (tile_ir/passes/placement.py)
            # holds at most ``most`` elements a thread: LLaMA's 2048-wide rows take 8-row
            # tiles, not 16 (a 16 x 2048 one stayed in shared memory: 330 ms at batch 32)
            while bm > 1 and bm * b.n > b.asked_threads(bm, b.n) * most and divisor_tile(b.m, bm // 2) < bm:
                bm = divisor_tile(b.m, bm // 2)
        return bm, b.n
    accs = 1 if b.sibling_of is not None else len(b.cs)

    def budget(bm: int) -> int:  # accumulator registers: a tile of fewer than 128 rows gets 128 threads
        return b.acc_budget if bm >= 128 else b.acc_budget * 128 // max(b.max_threads, 128)

    while accs * bm * bn * b.acc_dtype.itemsize > budget(bm) and max(bm, bn) > 16:
        if bn >= bm:
            bn = divisor_tile(cols, bn // 2)
        else:
            bm = divisor_tile(b.m, bm // 2)
    lead = math.prod(b.batch) * (len(b.cs) if b.sibling_of is not None else 1) * b.groups
    bm, bn = fill_cores((b.m, cols), [bm, bn], lead, b.cores, b.min_tile)
    plain = not isinstance(b.c.op, (Conv, ConvTranspose))  # convolution fills index channels directly
    if plain and 4 * bn < min(b.n, b.gemm_tile):  # N with no good divisor (a 50257-word LM head)
        bn = min(b.n, b.gemm_tile)
    if b.mma_rows > 1 and bm & (bm - 1) and b.m > 16 and not b.flip:
        # rows without a power-of-two divisor, which the matrix unit's warp layouts take
        # (ResNet-50's 49 and 112 x 112 positions): a power-of-two tile, the last one partial
        bm = min(1 << (bm - 1).bit_length(), b.gemm_rows)
    if b.mma_rows > 1 and not b.flip and (cols > 16 or b.groups > 1) and bn & (bn - 1):
        # the matrix unit's operand layouts take power-of-two column tiles (a 40-wide B
        # tile of MobileNetV2's 160 channels was refused): the largest dividing one, else
        # a power-of-two tile with a partial last one. A group has no partial tile: the
        # largest dividing one however narrow (20 columns of a group split their nests
        # over 4 threads, and nvcc ran past 15 minutes on its unrolled FMA loops)
        p2 = 1 << (bn.bit_length() - 1)
        while cols % p2:
            p2 //= 2
        if b.groups > 1:
            bn = p2
        else:
            bn = p2 if p2 >= 16 else min(1 << (bn - 1).bit_length(), b.gemm_tile)
    if b.mma_rows > 1 and not b.flip and b.m > 16 and bm < 16:
        # rows with no divisor worth a tile (ViT's 197 tokens, a prime): power-of-two
        # tiles, halved while the grid leaves cores idle, the last one partial
        bm = halve_while_idle(b.m, b.gemm_rows, lead * -(-cols // bn), b.cores, b.min_tile)
    elif _host_row_tail(b) and bm < 16:  # on a host: near-equal tiles, the last one partial
        bm = _balanced(b.m, b.gemm_rows, lead * -(-cols // bn), b.cores)
    if b.groups > 1 and b.mma_rows > 1 and bn == 8 and (b.op_dtype in HALF_FLOATS or b.tf32):
        # a group's narrow columns: TileLang takes a product of 64-row tiles to wgmma, which
        # refused an 8-column B tile (its operand layout); 32-row tiles keep the product
        # an FMA loop (the MMA's warps need 16 columns to split them)
        bm = min(bm, 32)
    force_m, force_n = b.target.gemm.force_tile_m, b.target.gemm.force_tile_n
    if force_m and b.m % force_m == 0:
        bm = force_m
    if force_n and cols % force_n == 0:
        bn = force_n
    return bm, bn


def _host_row_tail(b: "_Builder") -> bool:
    """Whether a host product may take a partial last row tile: a MatMul over more than
    16 rows (convolutions tile their positions their own way), a chain only where
    ``panels.py`` reads its input in place."""
    return (b.mma_rows <= 1 and isinstance(b.c.op, MatMul) and b.m > 16
            and (b.first is None or bool(panels.takes_panels(b))))


def _host_whole_rows(b: "_Builder") -> int:
    """Rows of a host's whole-row tile (an epilogue reduction's or a chain's): the
    fewest near-equal tiles, a multiple of the cores with the batch, whose on-chip
    buffers (the accumulator's rows) take at most half the core's cache (the other half
    for A's rows and the weight panels streaming through). A chain's by the bytes its
    tiles move past the cache (``tilefuse/chain_rows.py``): every tile reads both
    weights again, so it may take fewer tiles than fit, or a narrower K chunk
    (``b.chunk``)."""
    lead = math.prod(b.batch)
    step = b.cores // math.gcd(lead, b.cores)  # tiles a batch element takes so that every core has as many
    if b.first is not None:
        k1 = b.first.inputs[0].type.shape[-1]
        chain = chain_tiles(b.m, b.n, b.k, (k1 + b.n) * b.k * 4, step, min(b.k, b.tile_k),
                            panels.takes_panels(b), b.onchip)
        if chain.chunk != min(b.k, b.tile_k):
            b.chunk = chain.chunk
        return -(-b.m // chain.tiles)
    tiles = step
    while -(-b.m // tiles) * b.n * 4 > b.onchip // 2 and -(-b.m // (tiles + step)) < -(-b.m // tiles):
        tiles += step
    return -(-b.m // tiles)


def _balanced(extent: int, cap: int, lead: int, cores: int) -> int:
    """Rows of a host's tile over ``extent`` rows: tiles of at most ``cap``, as few as
    make ``lead`` x them a multiple of the cores (no core idle for the last wave), equal
    but for the last (197 tokens, 64-row cap, 2 cores: 4 tiles of 50, not 64, 64, 64, 5;
    the product core takes any row count)."""
    tiles = -(-extent // cap)
    while (lead * tiles) % cores and tiles < extent:
        tiles += 1
    return -(-extent // tiles)


def pipeline(b: "_Builder", bm: int, bn: int, bk: int) -> tuple[int, int]:
    """K depth and stages of a plain product tile of ``bn`` columns (all its
    accumulators'): a third stage, then a K tile twice as deep, while the operand tiles
    in flight stay within the target's ``inflight_bytes``. Small tiles (batch 1) wait on
    memory latency and gain from both; 128x128 tiles already keep 64 KB in flight, and
    more stages cost them occupancy."""
    per_k = (bm + bn) * b.op_dtype.itemsize
    if 3 * per_k * 2 * bk <= b.inflight and b.k >= 4 * bk:
        return 2 * bk, 3
    if 3 * per_k * bk <= b.inflight:
        return bk, 3
    return bk, 2


def depthwise_tile(b: "_Builder", threads: int) -> tuple[int, int]:
    """Output rows and channels of a depthwise convolution's tile on a device with blocks
    (a 1-D convolution's rows are its positions). A tile's nests run over (channels, rows, width), and thread fitting keeps only
    the power of two that divides their length: whole rows of a 28-wide map, 7 of them and
    8 channels (1568 = 32 x 49), left 8 threads of 196 unrolled elements per tap (MobileNetV2:
    a 2.7 MB cubin). Of the divisors of the channels (up to 64) and of the rows, with at most
    8 elements a thread, the pair that keeps the most threads (up to ``threads``), then the
    one whose grid fills the most cores, then the smaller tile."""
    out = b.c.outputs[0].type.shape
    channels, height, width = out[1], out[2], math.prod(out[3:])  # a 1-D convolution's rows are single positions

    def pow2(n: int) -> int:
        return n & -n

    best: tuple[tuple[int, int, int], tuple[int, int]] | None = None
    for ch in (d for d in range(1, min(channels, 64) + 1) if channels % d == 0):
        for rows in (d for d in range(1, height + 1) if height % d == 0):
            total = ch * rows * width
            t = min(pow2(total), threads)
            if total > 8 * t and (ch, rows) != (1, 1):
                continue
            blocks = out[0] * (channels // ch) * (height // rows)
            key = (t, min(blocks, b.cores), -total)
            if best is None or key > best[0]:
                best = key, (rows, ch)
    assert best is not None  # (1, 1) is always a candidate
    return best[1]
