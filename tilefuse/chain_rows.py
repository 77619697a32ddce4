"""How many whole-row tiles a host's weight chain takes, by the bytes they move past the
core's cache.

A chain ``act(x @ W1 + b1) @ W2`` on a host is one kernel whose tiles hold whole rows
(``tile_ir/lower/gemm_tiles.py``): a tile walks the hidden dim a K chunk at a time, the
chunk of ``x @ W1`` and the activation on chip, then the chunk's rows of ``W2`` into the
tile's accumulator of all ``n`` columns. Every tile streams both weights, so more tiles
read them more often; fewer tiles make the on-chip buffers (the accumulator, the chunk's
intermediate and its A tile) outgrow the cache, and the accumulator then passes through
the next level once a chunk. The tile count is the one that moves the fewest bytes:

    tiles x weights + (2 x the accumulator x chunks x tiles where the buffers outgrow
    half the cache; the other half is for the rows of A and the panels streaming by)

counted in multiples of ``step`` (every core as many tiles), each tile's K block of A
(the chunk's intermediate, read again for every panel of W2) within that half. Where a
narrower K chunk (down to 4 panels) fits the fewest tiles, that chunk (more passes over
an accumulator that stays on chip). Traffic to the next level counts as traffic to memory: the weights
usually come from memory, a spilled accumulator from the last-level cache, so the count
leans to more tiles. ViT-base's MLP (197 rows, 19 MB of weights) on a 512 KB cache took 4
tiles of 50 rows by the fit alone, 76 MB a layer; split in two parts (``split_chains``) of
one tile each, 36 MB and 0.80 of the time (benchmarks/NOTES.md, session 37).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ChainTiles:
    tiles: int  # whole-row tiles of the chain (a multiple of ``step``)
    chunk: int  # the hidden dim's K chunk a tile walks
    traffic: int  # bytes past the core's cache: weights once a tile, a spilled accumulator


def chain_tiles(rows: int, n: int, hidden: int, weight_bytes: int, step: int, chunk: int, width: int,
                cache_bytes: int) -> ChainTiles:
    """The chain's tiles over ``rows`` (``n`` output columns, ``hidden`` K of the second
    product, ``weight_bytes`` of W1 and W2, float32) with ``step`` tiles to a core round,
    a K chunk of ``chunk`` (narrowed by halves down to 4 panels of ``width`` where that
    fits the fewest tiles; 0 ``width``: never), on a core with ``cache_bytes`` of cache."""
    half = cache_bytes // 2

    def fits(tiles: int, c: int) -> bool:
        return -(-rows // tiles) * (n + 2 * c) * 4 <= half

    narrow = chunk
    while not fits(step, narrow) and width and narrow // 2 >= 4 * width and hidden % (narrow // 2) == 0:
        narrow //= 2
    if narrow != chunk and fits(step, narrow):
        return ChainTiles(step, narrow, weight_bytes * step)
    best: ChainTiles | None = None
    tiles = step
    while True:
        each = -(-rows // tiles)
        spill = 0 if fits(tiles, chunk) else 2 * each * n * 4 * -(-hidden // chunk) * tiles
        here = ChainTiles(tiles, chunk, weight_bytes * tiles + spill)
        # (a tile's K block of A, which the product core reads again for every panel, on chip)
        if (best is None or here.traffic < best.traffic) and each * chunk * 4 <= half:
            best = here
        if fits(tiles, chunk) or -(-rows // (tiles + step)) == each:
            return best or here
        tiles += step
