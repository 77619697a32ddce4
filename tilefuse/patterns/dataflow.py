"""Questions about dataflow inside a set of primitives that several patterns ask.

A group is a set of nodes of one graph: "inside" means reached through members only.
Rows are the unit every tiled pattern shares: a reduction's rows are its results, each
over ``extent`` elements; a product's rows are its outputs with the batch folded in.
"""
from __future__ import annotations

import math

from tilefuse.ir.graph import Node, Value
from tilefuse.ir.prims import Map, Reduce, ScalarFn


def row_signature(node: Node) -> tuple[int, int]:
    """(rows, extent) of a reduction: how many results, over how many elements each."""
    shape = node.inputs[0].type.shape
    if not isinstance(node.op, Reduce):
        raise TypeError(f"{node.op} has no row signature")
    axes = node.op.axes
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


def chained(a: Node, b: Node, members: set[int]) -> tuple[Node, Node] | None:
    """(first, second) of two products where one reads the other inside ``members``; None
    when neither does (two independent products)."""
    if depends_within(b, a, members):
        return a, b
    if depends_within(a, b, members):
        return b, a
    return None


def through_casts(v: Value, members: set[int]) -> Value:
    """``v`` before the casts (inside ``members``) that produced it: a half-float model's
    softmax is the float one with casts between its steps."""
    while v.producer is not None and id(v.producer) in members and isinstance(v.producer.op, Map) \
            and v.producer.op.fn is ScalarFn.CAST:
        v = v.producer.inputs[0]
    return v


def has_empty(nodes) -> bool:
    """A tensor with a dim of 0 among the nodes' inputs or outputs: nothing to tile."""
    return any(v.type.size == 0 for n in nodes for v in (*n.inputs, *n.outputs))
