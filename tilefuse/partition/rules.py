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
"""
from __future__ import annotations

import math
from typing import Sequence

from tilefuse.ir.graph import Node
from tilefuse.ir.prims import ArgReduce, MatMul, Reduce, Reshape
from tilefuse.partition.kinds import FusionKind, fusion_kind, is_window
from tilefuse.target import Target


def row_signature(node: Node) -> tuple[int, int]:
    """(rows, extent) of a reduction: how many results, over how many elements each."""
    shape = node.inputs[0].type.shape
    if isinstance(node.op, Reduce):
        axes = node.op.axes
    elif isinstance(node.op, ArgReduce):
        axes = (node.op.axis,)
    else:
        raise TypeError(f"{node.op} has no row signature")
    extent = math.prod(shape[a] for a in axes)
    return math.prod(shape) // max(extent, 1), extent


def contraction_rows(node: Node) -> tuple[int, int]:
    """(M rows, N columns) of a matrix product's output, batch folded into rows."""
    out = node.outputs[0].type.shape
    return math.prod(out[:-1]), out[-1]


def depends_within(later: Node, earlier: Node, members: set[int]) -> bool:
    """True if ``later`` reads (transitively, inside ``members``) an output of ``earlier``."""
    stack, seen = [later], set()
    while stack:
        n = stack.pop()
        for v in n.inputs:
            p = v.producer
            if p is None or id(p) not in members or id(p) in seen:
                continue
            if p is earlier:
                return True
            seen.add(id(p))
            stack.append(p)
    return False


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
            return chain_problem(contractions, reductions, members, target, written)
        return attention_problem(contractions, reductions, members, target)
    if contractions and reductions:
        return row_epilogue_problem(contractions[0], reductions, members, target)
    return None


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


def siblings(contractions: Sequence[Node]) -> bool:
    """Matrix products of one activation by constant weights of one shape: one wide GEMM
    whose tiles share the activation's tile (grouped-query attention's Q beside K and V,
    wider than they are, runs apart)."""
    first = contractions[0]
    return all(
        isinstance(c.op, MatMul)
        and c.inputs[0] is first.inputs[0]
        and c.inputs[1].is_constant
        and c.inputs[1].type.rank == 2
        and c.inputs[1].type.shape == first.inputs[1].type.shape
        for c in contractions
    )


def row_epilogue_problem(c: Node, reductions: Sequence[Node], members: set[int], target: Target) -> str | None:
    if not isinstance(c.op, MatMul):
        return "a reduction after a convolution needs whole channel rows"
    m, n = contraction_rows(c)
    for r in reductions:
        if not depends_within(r, c, members):
            return "a reduction feeding a contraction needs whole rows before the product"
        if row_signature(r) != (m, n):
            return f"the reduction's rows {row_signature(r)} are not the product's output rows {(m, n)}"
    need = target.gemm.row_epilogue_bytes(n)
    if need > target.device.onchip_bytes:
        return f"needs {need // 1024} KB on chip for whole rows of {n} > {target.device.onchip_bytes // 1024} KB"
    return None


def attention_problem(
    contractions: Sequence[Node], reductions: Sequence[Node], members: set[int], target: Target
) -> str | None:
    if len(contractions) != 2 or not all(isinstance(c.op, MatMul) for c in contractions):
        return "more than one contraction, and not an attention chain"
    c1, c2 = contractions
    if not depends_within(c2, c1, members):
        c1, c2 = c2, c1
    if not depends_within(c2, c1, members):
        return "two independent contractions on different inputs"
    p, v = c2.inputs
    v_from_c1 = v.producer is not None and id(v.producer) in members and (
        v.producer is c1 or depends_within(v.producer, c1, members)
    )
    if p.producer is None or id(p.producer) not in members or v_from_c1:
        return "the second product must take the first's row-wise result as its left operand"
    if c1.inputs[1].is_constant or c2.inputs[1].is_constant:
        return "a chain of products with weights does not stream (attention multiplies activations)"
    m, n = contraction_rows(c1)
    if not reductions:
        return "two chained products fuse only through a row softmax (flash-style)"
    if c2.inputs[0].type.shape[-1] != n:
        return "the second product does not reduce over the first's columns"
    for r in reductions:
        if row_signature(r) != (m, n):
            return f"attention's row ops must reduce the score rows {(m, n)}, not {row_signature(r)}"
    head = max(c1.inputs[0].type.shape[-1], c2.outputs[0].type.shape[-1])
    if head > target.attention.max_head_dim:
        return f"head dim {head} > {target.attention.max_head_dim} kept on chip"
    return None


def chain_problem(
    contractions: Sequence[Node], reductions: Sequence[Node], members: set[int], target: Target,
    written: frozenset[int] = frozenset(),
) -> str | None:
    """Two weight products back to back (an MLP: up-projection, activation, down-projection)."""
    chain = weight_chain(contractions, members, written)
    if isinstance(chain, str):
        return chain
    c1, c2 = chain
    for r in reductions:
        if not depends_within(r, c2, members) or row_signature(r) != contraction_rows(c2):
            return "a chain of products takes row reductions only after the second product"
    k1, n2 = c1.inputs[0].type.shape[-1], c2.outputs[0].type.shape[-1]
    need = target.gemm.row_epilogue_bytes(n2) + target.gemm.row_epilogue_bytes(k1)
    if need > target.device.onchip_bytes:
        return (f"a chain of products needs {need // 1024} KB on chip for whole rows "
                f"({k1} in, {n2} out) > {target.device.onchip_bytes // 1024} KB")
    # Apart, the first product tiles its columns too; chained, only rows make tiles.
    rows = contraction_rows(c2)[0]
    tiles = -(-rows // target.gemm.row_tile)
    if tiles < target.device.cores:
        return f"a chain of {rows} rows makes {tiles} whole-row tiles, fewer than the target's {target.device.cores} cores"
    return None


def weight_chain(
    contractions: Sequence[Node], members: set[int], written: frozenset[int] = frozenset()
) -> tuple[Node, Node] | str:
    """(first, second) product of a weight chain inside ``members``, or why it is not one:
    the first's output reaches the second's left operand only through elementwise ops and
    reshapes that regroup rows, and nothing else reads the intermediate (it stays on chip)."""
    if len(contractions) != 2 or not all(
        isinstance(c.op, MatMul) and c.inputs[1].is_constant and c.inputs[1].type.rank == 2 for c in contractions
    ):
        return "more than two weight products, or not plain matrix products"
    c1, c2 = contractions
    if not depends_within(c2, c1, members):
        c1, c2 = c2, c1
    if not depends_within(c2, c1, members):
        return "two independent contractions on different inputs"
    a = c2.inputs[0]
    if a.producer is None or id(a.producer) not in members:
        return "the second product's left operand does not come from the first"
    mid = c1.outputs[0].type
    stack, between, seen = [a.producer], [], {id(c1)}
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        out = n.outputs[0].type
        rows_kept = out.size == mid.size and out.shape[-1:] == mid.shape[-1:]
        if not rows_kept or not (fusion_kind(n) is FusionKind.ELEMENTWISE or isinstance(n.op, Reshape)):
            return "a chain of weight products fuses only through elementwise ops and row regroupings"
        between.append(n)
        stack += [v.producer for v in n.inputs if v.producer is not None and id(v.producer) in members]
    for n in [c1, *between]:
        if id(n.outputs[0]) in written or any(id(u) not in seen and u is not c2 for u in n.outputs[0].users):
            return "the intermediate of a chain of products is read outside the chain"
    return c1, c2
