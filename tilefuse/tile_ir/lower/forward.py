"""An epilogue as index functions: from an anchor element to each value's element.

The pattern (``patterns/epilogue.py``) found the Maps, Reshapes and Transposes that carry
an anchor's tile to the group's outputs; here each becomes a function from the anchor's
index to that value's index, so a kernel writes every output element from the one
anchor element behind it. Sibling products share one index space (the same tile
position in each).
"""
from __future__ import annotations

from typing import Callable, Sequence

from tilefuse.ir.graph import Node
from tilefuse.ir.prims import Map, Reshape, Transpose
from tilefuse.patterns import Epilogue
from tilefuse.tile_ir.lower.elements import Index, reshape_index

Forward = Callable[[Index], Index]


def forward_index(epilogue: Epilogue, anchors: Sequence[Node]) -> dict[int, Forward]:
    """id(value) -> anchor index -> that value's index, for the anchors' outputs and every
    value of the epilogue's steps."""
    fwd: dict[int, Forward] = {id(c.outputs[0]): (lambda g: g) for c in anchors}
    for node in epilogue.steps:
        chain = [u for u in node.inputs if id(u) in fwd]
        out = node.outputs[0]
        f = fwd[id(chain[0])]
        if isinstance(node.op, Map):
            fwd[id(out)] = f
        elif isinstance(node.op, Reshape):
            fwd[id(out)] = _reshaped(f, node.inputs[0].type.shape, out.type.shape)
        else:
            assert isinstance(node.op, Transpose), node.op
            fwd[id(out)] = _transposed(f, node.op.perm)
    return fwd


def _reshaped(f: Forward, src: tuple[int, ...], dst: tuple[int, ...]) -> Forward:
    return lambda g: reshape_index(f(g), src, dst)


def _transposed(f: Forward, perm: Sequence[int]) -> Forward:
    return lambda g: tuple(f(g)[p] for p in perm)
