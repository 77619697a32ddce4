"""Staged: the fallback every group has, each primitive a loop nest over scratch.

The specialised patterns tile a group around one anchor; when none applies (or a tensor
is empty: nothing to tile), every value that cannot be inlined as an element expression —
a reduction, a product, a scatter — gets a buffer of its full shape, computed in stages.
Its match says why the others refused, so a slow kernel is never a silent one.
"""
from __future__ import annotations

from dataclasses import dataclass

from tilefuse.ir.prims import (
    Conv,
    ConvTranspose,
    MatMul,
    Reduce,
    ScatterElements,
    ScatterND,
    WindowReduce,
)

# the primitives a staged kernel computes as stages of their own (the others inline)
STAGED = (Reduce, WindowReduce, MatMul, Conv, ConvTranspose, ScatterND, ScatterElements)


@dataclass(frozen=True, slots=True)
class StagedMatch:
    """The fallback, and why no specialised pattern applied."""

    reason: str
