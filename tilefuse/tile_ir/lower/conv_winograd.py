"""3 x 3 convolutions by Winograd's minimal filtering F(4 x 4, 3 x 3) on a host.

A 3 x 3 convolution with unit strides computes each 4 x 4 block of outputs of a channel
from a 6 x 6 patch of every input channel with 36 multiplications a pair of channels
instead of 144: the patch is turned (B^T d B), multiplied element by element by the turned
filter (G g G^T, a constant: turned once, at compile time), summed over input channels,
and turned back (A^T m A). Summed over channels, the 36 element-wise products are 36
matrix products ``m_xi[Cout x tiles] = u_xi[Cout x Cin] @ v_xi[Cin x tiles]``, which the
host's product core runs at its rate: ResNet-50's 3 x 3 convolutions of 64 channels on
56 x 56 maps took a third of the direct kernel's time by hand, those of 256 channels on
14 x 14 maps less than half.

The price is rounding: the turns scale values by up to 8 (A^T's 8 and B^T's 5, G's 1/24),
so an output's error is a few times a direct sum's (1e-5 of the outputs' scale on random
filters against 1e-6). ``ConvPolicy.winograd`` asks for it (the CPU target does); tiles
are blocks of whole output rows with every output channel of a block a row of the
product, as ``conv_rows`` lays out channel-rows convolutions, so the epilogue reads the
product tile as it reads theirs.

The program's tile for output rows ``[row0, row0 + rows)`` and channels ``[k0, k0 + bn)``
is one ``Winograd`` statement (tile_ir/ir.py) into the product tile, then the epilogue.
Its scratch, the turned patches of a chunk of input channels and the 36 sums, is sized
here against the core's cache (``Device.onchip_bytes``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import Conv
from tilefuse.tile_ir.ir import WINOGRAD_G, WINOGRAD_TILE, Buffer, Expr, IOp, Scope, Stmt, Var, Winograd, iop
from tilefuse.tile_ir.lower import conv_rows, gemm_weights
from tilefuse.tile_ir.lower.common import divisor_tile

if TYPE_CHECKING:
    from tilefuse.tile_ir.lower.gemm_epilogue import _Builder


@dataclass(frozen=True)
class WinogradTile:
    """A Winograd convolution's tile: ``rows`` output rows of one image (a divisor of the
    map's height) by ``channels`` output channels, input channels turned ``k_chunk`` at a
    time, the block's 4 x 4 tiles ``tiles`` in all."""

    rows: int
    channels: int
    k_chunk: int
    tiles: int


def tile(b: "_Builder") -> WinogradTile | None:
    """The tile of ``b``'s convolution computed by ``Winograd``, or None where it is not:
    a host whose policy asks for it (``ConvPolicy.winograd``), a single ungrouped 2-D 3 x 3
    float32 convolution with unit strides and dilations, channels as rows, its constant
    weight read by it alone, at least ``winograd_min_channels`` input and output channels
    (few channels leave the products too short to pay for the turns), and a block of whole
    output rows that holds at least ``winograd_min_tiles`` 4 x 4 tiles (a product's columns:
    fewer leave the core's vectors part empty; 7 x 7 maps hold 4), where the scratch of
    such a block leaves room in the core's cache for ``winograd_min_channels`` output and
    input channels at a time (rows thousands wide do not: their products would be a few
    channels deep)."""
    policy = b.target.conv
    op, x, w = b.c.op, b.c.inputs[0], b.c.inputs[1]
    if not (policy.winograd and isinstance(op, Conv) and len(b.cs) == 1 and b.first is None and b.flip
            and not b.depthwise and b.groups == 1 and not b.target.device.max_block_threads
            and tuple(w.type.shape[2:]) == (3, 3) and tuple(op.strides) == (1, 1) and tuple(op.dilations) == (1, 1)
            and gemm_weights.packs_conv_rows(b) and {b.acc_dtype, b.op_dtype, x.type.dtype} == {DType.FLOAT32}):
        return None
    cout, cin = w.type.shape[:2]
    if min(cout, cin) < policy.winograd_min_channels:
        return None
    batch, _, height, width = b.c.outputs[0].type.shape
    across = -(-width // WINOGRAD_TILE)

    def tiles_of(rows: int) -> int:
        return -(-rows // WINOGRAD_TILE) * across

    # blocks of whole rows dividing the map: the fewest rows computed past it (a block of
    # r rows computes whole tiles' rows), then the fewest tiles
    fits = [r for r in range(1, height + 1) if height % r == 0 and tiles_of(r) >= policy.winograd_min_tiles]
    if not fits:
        return None
    rows = min(fits, key=lambda r: (-(-r // WINOGRAD_TILE) * WINOGRAD_TILE / r, tiles_of(r)))
    tiles = tiles_of(rows)
    # the 36 sums of a tile's channels take at most half the core's cache, and the grid
    # has a tile for every core where channels can be split
    per_channel = 36 * tiles * 4
    channels = divisor_tile(cout, max(1, b.onchip // 2 // per_channel))
    blocks = batch * (height // rows)
    while blocks * (cout // channels) < b.cores and channels % 2 == 0 and channels // 2 >= policy.winograd_min_channels:
        channels //= 2
    k_chunk = divisor_tile(cin, max(1, b.onchip // 4 // per_channel))
    if min(channels, k_chunk) < policy.winograd_min_channels:
        return None
    return WinogradTile(rows, channels, k_chunk, tiles)


def weight(g: np.ndarray, t: WinogradTile) -> np.ndarray:
    """``g`` [Cout, Cin, 3, 3] turned, G g G^T per (output, input) channel (in float64), in
    the order a tile's products read it: [Cout / channels, Cin / k_chunk, 36, channels,
    k_chunk] float32, each tile's share one run, chunk after chunk (a stream the core's
    prefetcher follows: read as [36, Cout, Cin], 14 x 14 maps of 256 channels waited on
    memory for all of their products' time)."""
    cout, cin = g.shape[:2]
    gm = np.asarray(WINOGRAD_G, np.float64)
    u = np.einsum("ia,kcab,jb->ijkc", gm, g.astype(np.float64), gm).reshape(36, cout, cin)
    u = u.reshape(36, cout // t.channels, t.channels, cin // t.k_chunk, t.k_chunk).transpose(1, 3, 0, 2, 4)
    return np.ascontiguousarray(u.astype(np.float32))


def product(b: "_Builder", x_param: Buffer, tc: Buffer, mt: Var, n0: Expr, t: WinogradTile) -> tuple[tuple[Buffer, ...], list[Stmt]]:
    """The tile's product (position tile ``mt``, channels from ``n0``) into ``tc``
    [channels, rows x width]: one ``Winograd`` statement and its scratch buffers."""
    assert b.packed is not None
    op: Conv = b.c.op  # type: ignore[assignment]
    width = b.c.outputs[0].type.shape[3]
    image, first = conv_rows.origin(b, mt, t.rows)
    top, left = op.pads[0], op.pads[1]
    v = Buffer("wino_v", DType.FLOAT32, (36, t.k_chunk, t.tiles), Scope.FRAGMENT)
    m = Buffer("wino_m", DType.FLOAT32, (36, t.channels, t.tiles), Scope.FRAGMENT)
    return (v, m), [Winograd(x_param, image, iop(IOp.SUB, first, top), -left, b.packed, n0, v, m, tc, t.rows, width)]


def describe(t: WinogradTile) -> str:
    """The schedule note's words for the tile."""
    return (f", 3 x 3 by Winograd F(4 x 4, 3 x 3): {t.tiles} tiles of 4 x 4 a block, input channels turned "
            f"{t.k_chunk} at a time (36 products on the tap core)")
