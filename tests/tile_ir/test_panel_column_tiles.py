"""A host's product by packed weight panels takes column tiles of whole panels that divide
N where one lies near the tile it asked for (``panels.column_tile``), so no tile computes
clamped columns past N again (MobileNetV2's 960 channels: tiles of 96, not 128 with a last
one half past the end); where none does (1000 classes), the tile rounds up to whole panels
and the last one is partial. Compiled products match onnxruntime and the reference on
fresh random inputs either way; the whole tiles store without clamping their columns."""
from __future__ import annotations

import pytest

from tests.tile_ir.test_panel_gemm import _check_model, _group, product
from tilefuse.target import CPU
from tilefuse.tile_ir.ir import If, IndexOp, IOp, Store, statements, subexpressions
from tilefuse.tile_ir.lower import lower_group


@pytest.mark.parametrize("m, k, n, dividing", [(49, 160, 960, True), (49, 96, 320, True), (130, 64, 1000, False),
                                               (64, 40, 96, True)])
def test_column_tiles_are_whole_panels_dividing_n_where_one_is_near(m, k, n, dividing):
    model = product((), m, k, n)
    _, group = _group(model, CPU)
    s = lower_group(group, CPU).program.schedule
    width = CPU.gemm.panel_width
    assert s.panel_width == width and s.tile_n % width == 0, s
    assert (n % s.tile_n == 0) == dividing, s
    _check_model(model, (m, k), f"product {m}x{k}x{n}")


@pytest.mark.parametrize("lead, m, k, n, relu", [((), 130, 64, 1000, True), ((), 128, 96, 1001, False),
                                                 ((2,), 9, 40, 75, False)])
def test_whole_column_tiles_store_without_the_clamp(lead, m, k, n, relu):
    """With a partial last column tile (an LM head's 50257 words), the whole tiles store
    their columns as they are (runs) and only the last one clamps them to N - 1."""
    model = product(lead, m, k, n, relu=relu)
    _, group = _group(model, CPU)
    program = lower_group(group, CPU).program
    branches = [s for s in statements(program.body) if isinstance(s, If)]
    assert len(branches) == 2, program.notes

    def clamps(s) -> bool:
        return any(isinstance(e, IndexOp) and e.op is IOp.MIN for x in statements(s.body) if isinstance(x, Store)
                   for root in x.indices for e in subexpressions(root))
    assert [clamps(b) for b in branches] == [False, True]
    _check_model(model, (*lead, m, k), f"product {lead}x{m}x{k}x{n}")
