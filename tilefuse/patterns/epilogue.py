"""What follows an anchor inside a group: the epilogue a tiled kernel computes on chip.

A product (or a pooling reduction) computes a tile of its output; the group's outputs are
then written from that tile while it is on chip. That works when every value downstream
of the anchor is reached through Maps of the anchor's shape, Reshapes and Transposes:
each output element then has exactly one anchor element behind it, and its index is a
function of the anchor's (the lowering builds those functions from ``steps``). Row
reductions over a product's columns (a norm's mean and variance) may sit in between when
the tile holds whole rows: their per-row results are read where they broadcast.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tilefuse.ir.graph import Node, Value
from tilefuse.ir.prims import Kind, Map, MatMul, Reduce, Reshape, Transpose
from tilefuse.patterns.refusal import Refusal


@dataclass(frozen=True, slots=True)
class Epilogue:
    """``steps``: the Maps, Reshapes and Transposes downstream of the anchors, in group
    order (each reads at least one value already reached); ``reductions``: the row
    reductions among them, whose results are per-row values."""

    steps: tuple[Node, ...]
    reductions: tuple[Node, ...]


def _row_reduction(node: Node, ident: set[int], anchors: Sequence[Node]) -> bool:
    """A keepdims reduction of a product-shaped value over its columns (a norm's mean or
    variance): computable on a tile that holds whole rows."""
    op, x = node.op, node.inputs[0]
    return (
        isinstance(op, Reduce)
        and isinstance(anchors[0].op, MatMul)
        and op.keepdims
        and op.axes == (x.type.rank - 1,)
        and id(x) in ident
    )


def match_epilogue(nodes: Sequence[Node], outputs: Sequence[Value], anchors: Sequence[Node]) -> Epilogue | Refusal:
    """The epilogue of ``anchors`` (sibling products share one index space) among
    ``nodes``, given the group's ``outputs``, or why each output element does not have
    exactly one anchor element behind it."""
    reached = {id(c.outputs[0]) for c in anchors}
    ident = set(reached)  # values whose last axis is the product's columns, rows in row order
    steps: list[Node] = []
    reductions: list[Node] = []
    for node in nodes:
        chain = [u for u in node.inputs if id(u) in reached]
        if not chain or node in anchors:
            continue
        out = node.outputs[0]
        if _row_reduction(node, ident, anchors):
            reductions.append(node)
            continue
        if isinstance(node.op, Map):
            if any(u.type.shape != out.type.shape for u in chain):
                return Refusal("the anchor's result is broadcast: one element, many outputs")
            if all(id(u) in ident for u in chain):
                ident.add(id(out))
        elif isinstance(node.op, Reshape):
            src = node.inputs[0]
            if id(src) in ident and src.type.shape[-1:] == out.type.shape[-1:]:
                ident.add(id(out))  # rows regrouped, columns untouched: still row-wise
        elif not isinstance(node.op, Transpose):
            return Refusal(f"{node.op.name} after the anchor is neither elementwise nor a reshape or transpose")
        reached.add(id(out))
        steps.append(node)
    for node in nodes:  # nothing downstream may leave through another path
        if node in anchors or node in reductions:
            continue
        if any(id(u) in reached for u in node.inputs) and id(node.outputs[0]) not in reached:
            return Refusal("a value downstream of the anchor leaves through another path")
    if not all(id(v) in reached for v in outputs):
        return Refusal("an output is not reached from the anchor")
    if any(n.op.kind is Kind.REDUCE and n not in reductions and n not in anchors for n in nodes):
        return Refusal("a reduction that is not over the product's rows")
    return Epilogue(tuple(steps), tuple(reductions))
