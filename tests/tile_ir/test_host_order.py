"""On a host, weights come from memory as few times as the tiles allow. A product by
packed constant weights larger than its A operand nests its column tiles outside its row
tiles (``TileProgram.host_order``, set in
tile_ir/lower/gemm_epilogue.py, honoured by codegen/cpu/emit.py): a weight panel's row
tiles run one after the other with the panel in cache, and a static schedule splits the
columns between threads, so the weights come from memory once. A product whose epilogue
needs whole rows, or a chain, cannot split its columns: it takes as few row tiles as give
every core one and fit half a core's cache (``gemm_tiles._host_whole_rows``); a chain
over few rows is split in parts, one a core (``partition/split_chains.py``). Neither
changes a result: compiled kernels match onnxruntime and the reference on fresh random
inputs."""
from __future__ import annotations

import dataclasses
import re

import pytest

from tests.tile_ir.test_panel_gemm import _check_model, _group, mlp, product, siblings
from tilefuse.codegen.cpu import emit_program
from tilefuse.errors import GraphError
from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.target import CPU
from tilefuse.tile_ir.lower import lower_group
from tilefuse.tile_ir.verify import verify_program


def _grid_loops(text: str) -> list[str]:
    """The loop variables of the kernel's parallel grid nest, outermost first."""
    nest = text[text.index("#pragma omp parallel for collapse"):]
    return re.findall(r"for \(int64_t (\w+) = 0;", nest)[:3]


@pytest.mark.parametrize("lead, m, k, n", [((1,), 256, 768, 768), ((1,), 130, 257, 1000), ((), 140, 300, 640)])
def test_weights_larger_than_a_put_column_tiles_outermost(lead, m, k, n):
    model = product(lead, m, k, n)
    _, group = _group(model, CPU)
    program = lower_group(group, CPU).program
    rows, cols = program.grid[-2:]
    assert rows >= 2 and cols >= 2, program.grid  # (the case: several tiles both ways)
    lead_axes = len(program.grid) - 2
    assert program.host_order == (*range(lead_axes), lead_axes + 1, lead_axes), program.host_order
    assert "column tiles outermost" in program.notes[0]
    loops = _grid_loops(emit_program(program).text)
    assert loops.index("bn") < loops.index("bm"), loops
    _check_model(model, (*lead, m, k), f"product {lead} {m}x{k}x{n}")


def test_sibling_products_count_every_weight():
    """Q, K and V of 256 x 256 each: three 256 x 256 weights (196K) against A's 64K."""
    model = siblings(256, 256, 256)
    _, group = _group(model, CPU)
    program = lower_group(group, CPU).program
    assert program.grid == (1, 2, 4) and program.host_order == (0, 2, 1), (program.grid, program.host_order)
    _check_model(model, (1, 256, 256), "siblings 256x256x256")


def test_an_a_larger_than_the_weights_keeps_row_tiles_outermost():
    model = product((), 2048, 64, 128)
    _, group = _group(model, CPU)
    program = lower_group(group, CPU).program
    assert program.grid == (16, 2) and program.host_order == (), (program.grid, program.host_order)
    loops = _grid_loops(emit_program(program).text)
    assert loops.index("bm") < loops.index("bn"), loops
    _check_model(model, (2048, 64), "product 2048x64x128")


def test_a_host_order_that_is_not_an_order_of_the_grid_is_refused():
    _, group = _group(product((1,), 128, 768, 768), CPU)
    program = lower_group(group, CPU).program
    for bad in ((0, 1), (0, 1, 1), (0, 1, 3)):
        with pytest.raises(GraphError, match="host_order"):
            verify_program(dataclasses.replace(program, host_order=bad))


def _chain_program(model):
    graph = import_onnx(model)
    (group,) = [g for g in partition_graph(graph, CPU).groups
                if getattr(lower_group(g, CPU).program.schedule, "chain", False)]
    return lower_group(group, CPU).program


@pytest.mark.parametrize("m, d, hidden, grid, tile_k", [(197, 768, 3072, (2, 1, 1), 256), (128, 768, 3072, (2, 1, 1), 128),
                                                        (1000, 256, 1024, (1, 2, 1), 256), (4096, 768, 3072, (1, 8, 1), 256)])
def test_whole_row_tiles_move_the_fewest_bytes(m, d, hidden, grid, tile_k):
    """A chain's whole-row tiles each read both weights, so they are as few as move the
    fewest bytes past the core's 1 MB (tilefuse/chain_rows.py). ViT's 197 tokens and
    bert-base's 128: the chain split in two parts (partition/split_chains.py), one tile
    of all the rows a part (ViT's accumulator outgrowing the cache, 36 MB a layer
    against 38 for 2 tiles of 99 whole; bert's fitting with its K chunk narrowed to 128).
    1000 rows by 2 MB of weights: 2 tiles of 500 rows (12 MB moved, as many as 6 tiles
    that fit: the fewer on a tie). 4096 rows: 8 tiles of 512, the most rows whose K block
    of A (read again for every panel) fits half the cache."""
    program = _chain_program(mlp(m, d, hidden))
    s = program.schedule
    assert program.grid == grid, (program.grid, s.tile_m, s.tile_k)
    assert s.tile_m == (m if grid[0] == 2 else -(-m // grid[1])) and s.tile_k == tile_k, (s.tile_m, s.tile_k)
    assert s.tile_m * s.tile_k * 4 <= CPU.device.onchip_bytes // 2


@pytest.mark.parametrize("m", [197, 75])
def test_whole_row_products_compute_what_onnxruntime_does(m):
    """A chain over row tiles with a partial last one (197 = 99 + 98; 75 = 38 + 37)."""
    model = mlp(m, 256, 544)
    _, group = _group(model, CPU)
    program = lower_group(group, CPU).program
    assert program.grid == (1, 2, 1) and m % program.schedule.tile_m, (program.grid, program.schedule.tile_m)
    _check_model(model, (1, m, 256), f"mlp {m}x256x544")
