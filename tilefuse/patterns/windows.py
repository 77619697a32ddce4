"""Windows: one pooling reduction and its elementwise neighbours.

A group without products whose one reduction is a WindowReduce (max, average and Lp
pooling, LRN) or a Reduce the row pattern does not take (a global pool over the spatial
axes) is tiled over the reduction's output, each element folding its window's taps. It
applies when every output is an epilogue of the reduction (``epilogue.py``): one
reduction element behind each output element.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tilefuse.ir.graph import Node, Value
from tilefuse.ir.prims import Kind, Reduce, WindowReduce
from tilefuse.patterns.dataflow import has_empty
from tilefuse.patterns.epilogue import Epilogue, match_epilogue
from tilefuse.patterns.refusal import Refusal
from tilefuse.patterns.staged import STAGED
from tilefuse.target import Target


@dataclass(frozen=True, slots=True)
class WindowsMatch:
    """The one ``reduction`` the kernel tiles over its output, and what follows it."""

    reduction: Node
    epilogue: Epilogue


def match_windows(nodes: Sequence[Node], outputs: Sequence[Value], target: Target) -> WindowsMatch | Refusal:
    """The group as tiles of its one reduction's output, or why not."""
    reductions = [n for n in nodes if n.op.kind is Kind.REDUCE]
    if len(reductions) != 1 or not isinstance(reductions[0].op, (WindowReduce, Reduce)):
        return Refusal("not one window or axis reduction")
    (r,) = reductions
    if any(n is not r and (n.op.kind in (Kind.CONTRACT, Kind.OPAQUE) or isinstance(n.op, STAGED)) for n in nodes):
        return Refusal("a product or scatter beside the reduction")
    if has_empty(nodes) or not r.outputs[0].type.shape:
        return Refusal("empty tensors, or a reduction to a scalar (no output to tile)")
    epilogue = match_epilogue(nodes, outputs, [r])
    if isinstance(epilogue, Refusal):
        return epilogue
    return WindowsMatch(r, epilogue)
