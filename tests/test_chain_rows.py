"""A host chain's whole-row tiles by the bytes they move past the core's cache
(tilefuse/chain_rows.py), on the cases its docstring and NOTES.md name: every tile
reads both weights, a tile whose buffers outgrow half the cache passes its accumulator
through the next level once a K chunk, and a tile's K block of A stays within that half."""
from __future__ import annotations

from tilefuse.chain_rows import ChainTiles, chain_tiles

MB = 1 << 20
VIT_WEIGHTS = 2 * 768 * 3072 * 4  # ViT-base's (and bert-base's) W1 and W2, 18.9 MB


def test_vit_on_a_512_kb_cache_takes_4_tiles_whole_and_one_a_part_split():
    whole = chain_tiles(197, 768, 3072, VIT_WEIGHTS, 2, 256, 32, MB // 2)
    # 2 tiles of 99 spill their 304 KB accumulators 12 times each (14.6 MB) and read the
    # weights twice (37.7): 52.3 MB, against 4 tiles of 50 that fit, 75.5
    assert whole == ChainTiles(2, 256, 2 * VIT_WEIGHTS + 2 * 99 * 768 * 4 * 12 * 2)
    part = chain_tiles(197, 768, 1536, VIT_WEIGHTS // 2, 1, 256, 32, MB // 2)
    assert part == ChainTiles(1, 256, VIT_WEIGHTS // 2 + 2 * 197 * 768 * 4 * 6)


def test_a_narrower_chunk_that_fits_the_fewest_tiles_is_taken():
    # bert-base's 128 rows on 1 MB: (768 + 2 x 256) x 4 x 128 > 512 KB; with chunks of 128, = 512 KB
    assert chain_tiles(128, 768, 1536, VIT_WEIGHTS // 2, 1, 256, 32, MB) == ChainTiles(1, 128, VIT_WEIGHTS // 2)
    # ... never below 4 panels, nor without panels (width 0)
    assert chain_tiles(128, 768, 1536, VIT_WEIGHTS // 2, 1, 256, 0, MB).chunk == 256


def test_weights_that_fit_take_the_tiles_that_fit():
    small = 256 * 1024 * 4 * 2  # 2 MB: 4 tiles of 150 rows that fit move 8.4 MB, 2 of 300 that spill 4.2 + 4.9
    assert chain_tiles(600, 256, 1024, small, 2, 256, 32, MB) == ChainTiles(4, 256, 4 * small)


def test_a_tile_keeps_its_k_block_of_a_within_half_the_cache():
    got = chain_tiles(4096, 768, 3072, VIT_WEIGHTS, 2, 256, 32, MB)
    assert got.tiles == 8 and -(-4096 // got.tiles) * 256 * 4 <= MB // 2, got
    # fewer tiles would move fewer bytes (2: 37.7 + 302 MB), but their K blocks of A would not fit
    assert got.traffic == 8 * VIT_WEIGHTS + 2 * 512 * 768 * 4 * 12 * 8
