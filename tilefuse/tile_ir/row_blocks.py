"""A host product's A bound in row blocks: the layout ``StridedGemm.a_blocks`` names.

The product core (codegen/cpu/prelude.py) walks a tile's rows in register blocks: blocks
of 12 rows, the last 13 to 23 as two near-equal ones (``tf_strip_32``'s rule). Rows as
stored, a block's K step reads one value from each of r rows ``K`` floats apart: r
streams, which a cold weight's 12 rows 4 KB apart defeat the prefetcher with. In row
blocks each tile of ``tile`` rows is stored block by block, a block of r rows as
[K][r]: a K step is one run of r floats and the tile one stream. A block that starts at
row i of its tile lies at ``i * K`` from the tile's start, its K step p ``p * r`` into it.
The values are the weight's; only their order changes (the weights are constants, so
the order is chosen at compile time).
"""
from __future__ import annotations

import numpy as np

BLOCK_ROWS = 12  # the core's tallest register block (AVX-512: 12 x 32 accumulators)


def blocks(m: int, tallest: int = BLOCK_ROWS) -> list[tuple[int, int]]:
    """The core's register blocks over ``m`` rows: (first row, rows), in order; blocks of
    ``tallest`` rows (the AVX-512 core's by default, ``tf_strip_32``; the AVX2 core's 6,
    ``tf_strip_16``), the last ``tallest`` + 1 to 2 x ``tallest`` - 1 rows as two
    near-equal ones."""
    out, i = [], 0
    while i < m:
        left = m - i
        r = tallest if left >= 2 * tallest else ((left + 1) // 2 if left > tallest else left)
        out.append((i, r))
        i += r
    return out


def pack(rows: np.ndarray, tile: int) -> np.ndarray:
    """``rows`` [M, K] (M a multiple of ``tile``) in row blocks, as an [M, K] array whose
    memory holds each tile's blocks in turn."""
    m, k = rows.shape
    if tile <= 0 or m % tile:
        raise ValueError(f"row blocks of tiles of {tile} rows do not fit {m} rows")
    flat = np.empty(m * k, rows.dtype)
    for t0 in range(0, m, tile):
        for i, r in blocks(tile):
            start = (t0 + i) * k
            flat[start:start + r * k] = rows[t0 + i:t0 + i + r].T.reshape(-1)
    return flat.reshape(m, k)


def unpack(data: np.ndarray, tile: int) -> np.ndarray:
    """The [M, K] rows that ``pack(rows, tile)`` laid out as ``data``."""
    m, k = data.shape
    flat = data.reshape(-1)
    rows = np.empty((m, k), data.dtype)
    for t0 in range(0, m, tile):
        for i, r in blocks(tile):
            start = (t0 + i) * k
            rows[t0 + i:t0 + i + r] = flat[start:start + r * k].reshape(k, r).T
    return rows
