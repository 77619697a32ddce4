"""Patterns: which kernel a fusion group becomes, decided once, on the graph.

A stage between the partitioner and the tile IR. Each module holds one family's
graph-level matcher, returning a frozen typed match (the nodes the kernel is built
around) or a ``Refusal`` saying why it does not apply: ``attention`` (flash-style),
``gemm`` (a product with its epilogue, siblings, a weight chain), ``rows`` (row
reductions), ``windows`` (pooling), ``scatter`` (tiles that own their updates),
``staged`` (the fallback). ``epilogue`` is what
products and pools share; ``select`` tries them in order. The partitioner's structural
rules ask the families' growth-time questions here, the partition's groups carry their
match (``FusedGroup.match``), and ``tile_ir.lower`` dispatches on its type without
matching again. Patterns see the IR and the target only.
"""
from tilefuse.patterns.attention import AttentionMatch, Softmax
from tilefuse.patterns.epilogue import Epilogue
from tilefuse.patterns.gemm import GemmMatch
from tilefuse.patterns.refusal import Refusal
from tilefuse.patterns.rows import RowsMatch
from tilefuse.patterns.scatter import ScatterMatch
from tilefuse.patterns.select import Match, match_group, pattern_name
from tilefuse.patterns.staged import STAGED, StagedMatch
from tilefuse.patterns.windows import WindowsMatch

__all__ = ["AttentionMatch", "Epilogue", "GemmMatch", "Match", "Refusal", "RowsMatch", "STAGED", "ScatterMatch",
           "Softmax", "StagedMatch", "WindowsMatch", "match_group", "pattern_name"]
