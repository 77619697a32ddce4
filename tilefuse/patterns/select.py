"""Which pattern a group is: the first that applies, in a fixed order.

The order is the specialised kernels' before the fallback, the more specific before the
more general: attention (two products and a softmax) before a product with its epilogue,
rows before windows (a global pool over the last axis is a row reduction), then a lone
scatter, staged last — it applies to every group. A group with an empty tensor is staged (nothing to tile); an
opaque group is no kernel at all (its match is a Refusal: it runs as a host step).
"""
from __future__ import annotations

from typing import Callable, Sequence, Union

from tilefuse.ir.graph import Node, Value
from tilefuse.ir.prims import Kind
from tilefuse.patterns.attention import AttentionMatch, match_attention
from tilefuse.patterns.dataflow import has_empty
from tilefuse.patterns.gemm import GemmMatch, match_gemm
from tilefuse.patterns.refusal import Refusal
from tilefuse.patterns.rows import RowsMatch, match_rows
from tilefuse.patterns.scatter import ScatterMatch, match_scatter
from tilefuse.patterns.staged import StagedMatch
from tilefuse.patterns.windows import WindowsMatch, match_windows
from tilefuse.target import Target

Match = Union[AttentionMatch, GemmMatch, RowsMatch, WindowsMatch, ScatterMatch, StagedMatch]
Matcher = Callable[[Sequence[Node], Sequence[Value], Target], "Match | Refusal"]

# (name, match type, matcher), tried in this order
SPECIALISED: tuple[tuple[str, type, Matcher], ...] = (
    ("attention", AttentionMatch, match_attention),
    ("gemm", GemmMatch, match_gemm),
    ("rows", RowsMatch, match_rows),
    ("windows", WindowsMatch, match_windows),
    ("scatter", ScatterMatch, match_scatter),
)


def match_group(nodes: Sequence[Node], outputs: Sequence[Value], target: Target,
                after: type | None = None) -> Match | Refusal:
    """The first pattern of ``nodes`` (a group, in graph order, writing ``outputs``) for
    ``target``; with ``after``, the first after that match type (what a lowering that
    could not tile its match falls back to)."""
    if any(n.op.kind is Kind.OPAQUE for n in nodes):
        return Refusal("opaque: runs as a host step")
    if has_empty(nodes):
        return StagedMatch("empty tensors: nothing to tile")
    tried = [t for _, t, _ in SPECIALISED]
    start = 0 if after is None else (tried.index(after) + 1 if after in tried else len(tried))
    refused = []
    for name, _, matcher in SPECIALISED[start:]:
        match = matcher(nodes, outputs, target)
        if not isinstance(match, Refusal):
            return match
        refused.append(f"{name}: {match.reason}")
    return StagedMatch("; ".join(refused) or "no specialised pattern left")


def pattern_name(match: object) -> str:
    """The pattern's short name (``attention``, ``gemm``, ..., ``staged``)."""
    for name, t, _ in SPECIALISED:
        if isinstance(match, t):
            return name
    return "staged" if isinstance(match, StagedMatch) else "none"
