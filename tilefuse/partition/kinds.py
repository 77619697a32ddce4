"""Fusion kinds: what a primitive is to the partitioner, derived from its definition.

The kinds form an ordered lattice: a group's kind is the largest kind among its
members, and the anchor of a group is a member of that kind.
"""
from __future__ import annotations

import enum

from tilefuse.ir.graph import Node
from tilefuse.ir.prims import Kind, WindowReduce


class FusionKind(enum.IntEnum):
    INJECTIVE = 0  # pure data movement: becomes addressing inside a group
    ELEMENTWISE = 1  # a scalar function per output element (broadcasts included)
    REDUCE = 2  # reduces rows (or windows) of its input
    CONTRACTION = 3  # matrix product or convolution: a group's anchor
    OPAQUE = 4  # runs on its own, by its reference implementation

    def __str__(self) -> str:
        return self.name.lower()


_BY_KIND = {
    Kind.INDEX: FusionKind.INJECTIVE,
    Kind.MAP: FusionKind.ELEMENTWISE,
    Kind.REDUCE: FusionKind.REDUCE,
    Kind.CONTRACT: FusionKind.CONTRACTION,
    Kind.OPAQUE: FusionKind.OPAQUE,
}


def fusion_kind(node: Node) -> FusionKind:
    return _BY_KIND[node.op.kind]


def is_window(node: Node) -> bool:
    """Pooling: a reduction over sliding windows, tiled differently from row reductions."""
    return isinstance(node.op, WindowReduce)
