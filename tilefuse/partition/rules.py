"""What one tile-level kernel can compute: the structural fusion rules.

``structure_problem(nodes, target)`` says why a set of primitives cannot be one kernel,
or returns None. The rules follow from how kernels are tiled, not from op names:

- elementwise and index primitives fit anywhere (they become per-element code and
  addressing);
- reductions in one kernel must share their rows (same row count and extent);
- a contraction's epilogue may hold a row reduction when a tile can hold whole output
  rows on chip (a norm after a projection);
- two contractions fit together when they are siblings reading one activation with
  constant weights (one wider GEMM); or an attention chain: the first's output reaches
  the second only through row-wise ops along its columns (online softmax, flash-style);
  or a weight chain (an MLP): the first's output reaches the second's left operand only
  through elementwise ops, so a tile of rows computes the intermediate a column chunk at
  a time and never writes it - when whole output rows and input rows fit on chip;
- pooling is tiled by windows and joins only elementwise neighbours; opaque primitives
  are always alone.

The questions that belong to one kind of kernel (siblings, a weight chain, attention,
whole rows after a product) are asked of that pattern's module in ``tilefuse/patterns/``,
the same module that later matches the final group; this one says which applies.
"""
from __future__ import annotations

from typing import Sequence

from tilefuse.ir.graph import Node
from tilefuse.partition.kinds import FusionKind, fusion_kind, is_window
from tilefuse.patterns import Refusal
from tilefuse.patterns.attention import attention_problem
from tilefuse.patterns.dataflow import row_signature
from tilefuse.patterns.gemm import chain_problem, row_epilogue_problem, siblings
from tilefuse.target import Target


def structure_problem(nodes: Sequence[Node], target: Target, written: frozenset[int] = frozenset()) -> str | None:
    """Why ``nodes`` cannot be one kernel, or None. ``written``: ids of values that must be
    written whatever their readers (graph outputs)."""
    kinds = [fusion_kind(n) for n in nodes]
    if FusionKind.OPAQUE in kinds and len(nodes) > 1:
        return "opaque op runs alone"
    if len(nodes) > target.partition.max_group_depth and longest_path(nodes) > target.partition.max_group_depth:
        return f"group depth cap ({target.partition.max_group_depth} primitives along a path)"
    contractions = [n for n, k in zip(nodes, kinds) if k is FusionKind.CONTRACTION]
    reductions = [n for n, k in zip(nodes, kinds) if k is FusionKind.REDUCE]
    windows = [n for n in reductions if is_window(n)]
    if windows and (contractions or len(reductions) > 1):
        return "pooling is tiled by windows; it fuses only with elementwise ops"
    rows = {row_signature(r) for r in reductions if not is_window(r)}
    if len(rows) > 1:
        (r1, e1), (r2, e2) = sorted(rows)[:2]
        return f"reductions over different rows ({r1}x{e1} vs {r2}x{e2})"
    members = {id(n) for n in nodes}
    if len(contractions) > 1:
        if siblings(contractions):
            return "sibling contractions cannot share a reduction epilogue" if reductions else None
        if all(c.inputs[1].is_constant for c in contractions):
            return _reason(chain_problem(contractions, reductions, members, target, written))
        return _reason(attention_problem(contractions, reductions, members, target))
    if contractions and reductions:
        return _reason(row_epilogue_problem(contractions[0], reductions, members, target))
    return None


def _reason(problem: Refusal | None) -> str | None:
    return None if problem is None else problem.reason


def longest_path(nodes: Sequence[Node]) -> int:
    """The most primitives on one producer-to-consumer path inside ``nodes`` (any order;
    walked with a stack, not recursion, since deep groups are what this measures)."""
    members = {id(n) for n in nodes}
    depth: dict[int, int] = {}
    for start in nodes:
        stack = [start]
        while stack:
            n = stack[-1]
            if id(n) in depth:
                stack.pop()
                continue
            producers = [v.producer for v in n.inputs if v.producer is not None and id(v.producer) in members]
            pending = [p for p in producers if id(p) not in depth]
            if pending:
                stack.extend(pending)
                continue
            depth[id(n)] = 1 + max((depth[id(p)] for p in producers), default=0)
            stack.pop()
    return max(depth.values(), default=0)
