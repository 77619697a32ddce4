"""Scatter: one ScatterND or ScatterElements, on a device with blocks.

The staged schedule copies the data and then applies every update in order, on one block
of one thread, with the whole output on chip: a KV-cache write of 16 rows into 2,048 x 256
was refused on sm_90a, a smaller one ran serially. Here the output is cut into tiles that
each block owns: it reads its tile of the data, applies the updates that land in it in the
order the operator gives them (so repeated indices and reductions keep ONNX Runtime's
answer, with no atomics), and writes the tile. What the scatter reads may be computed on
the way in (a cast, a reshape: its prologue); nothing may follow it in the group.
On the CPU the staged schedule already copies in parallel and scatters in order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tilefuse.ir.graph import Node, Value
from tilefuse.ir.prims import Kind, ScatterElements, ScatterND
from tilefuse.patterns.dataflow import has_empty
from tilefuse.patterns.refusal import Refusal
from tilefuse.patterns.staged import STAGED
from tilefuse.target import Target


@dataclass(frozen=True, slots=True)
class ScatterMatch:
    """The group's one scatter, whose result is the group's one output."""

    scatter: Node


def match_scatter(nodes: Sequence[Node], outputs: Sequence[Value], target: Target) -> ScatterMatch | Refusal:
    """The group as tiles that own their updates, or why not."""
    scatters = [n for n in nodes if isinstance(n.op, (ScatterND, ScatterElements))]
    if len(scatters) != 1:
        return Refusal("not one scatter")
    (s,) = scatters
    if any(n is not s and (n.op.kind in (Kind.CONTRACT, Kind.OPAQUE) or isinstance(n.op, STAGED)) for n in nodes):
        return Refusal("a product, reduction or window beside the scatter")
    if has_empty(nodes):
        return Refusal("empty tensors: nothing to tile")
    if list(outputs) != [s.outputs[0]]:
        return Refusal("the scatter's result is not the group's one output")
    if not target.device.max_block_threads:
        return Refusal("no blocks on this target: the staged schedule copies in parallel and scatters in order")
    return ScatterMatch(s)
