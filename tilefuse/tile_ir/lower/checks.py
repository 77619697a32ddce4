"""Index checks: every index a kernel reads from data at run time is checked where it is
used as an address.

An index-consuming primitive (Gather, GatherElements, GatherND, ScatterND,
ScatterElements) whose indices are not a constant gets one check *site* per index
coordinate; its IndexCheck expressions (tile_ir.ir) wrap a negative index, replace one
outside ``[-n, n)`` by 0 so that no access leaves its buffer, and record the site and the
value in the kernel's status word. The runtime reads that word once per run and reports
the site's ``what``. Constant indices are checked here, once, at compile time (the
frontend reports a model's own; this catches graphs built by hand).

Sites are numbered over the group's nodes in order, so every schedule that lowers the
group numbers them alike, and identical groups (a model's layers) get identical kernels.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tilefuse.errors import GraphError, ShapeError
from tilefuse.ir.graph import Node, Value
from tilefuse.ir.prims import (
    Broadcast,
    Gather,
    GatherElements,
    GatherND,
    Map,
    Reshape,
    ScalarFn,
    ScatterElements,
    ScatterND,
    Slice,
    Transpose,
)
from tilefuse.partition.model import FusedGroup
from tilefuse.tile_ir.ir import Expr, IndexCheck

# primitive -> its indices' input position
INDEX_INPUT = {Gather: 1, GatherElements: 1, GatherND: 1, ScatterND: 1, ScatterElements: 1}


@dataclass(frozen=True)
class IndexSite:
    """One checked index coordinate: ``what`` names it for people (the graph input it
    comes from, when it does, and the ONNX node reading it); valid indices lie in
    ``[-extent, extent)``. The compiler hands it to the plan as plan.IndexSite, which
    words the runtime's message (the plan stage does not import this one)."""

    what: str
    extent: int


def extents(node: Node) -> tuple[int, ...]:
    """The range of each index coordinate ``node`` reads (one but for the ND ops)."""
    op, data, ind = node.op, node.inputs[0], node.inputs[1]
    if isinstance(op, (Gather, GatherElements, ScatterElements)):
        return (data.type.shape[op.axis],)
    lead = op.batch_dims if isinstance(op, GatherND) else 0
    return tuple(data.type.shape[lead : lead + ind.type.shape[-1]])


class IndexSites:
    """The check sites of one group, numbered in node order, then coordinate."""

    def __init__(self, group: FusedGroup) -> None:
        self.sites: list[IndexSite] = []
        self._ids: dict[tuple[int, int], int] = {}  # (id(node), coordinate) -> site
        for node in group.nodes:
            if type(node.op) not in INDEX_INPUT:
                continue
            ind = node.inputs[INDEX_INPUT[type(node.op)]]
            if ind.is_constant:
                _check_constant(node, ind)
                continue
            for j, n in enumerate(extents(node)):
                if n == 0 and node.outputs[0].type.size:
                    raise ShapeError(f"{node.op.name} node '{node.origin or node.name}' reads indices into an empty "
                                     f"axis: every index is out of range")
                self._ids[(id(node), j)] = len(self.sites)
                self.sites.append(IndexSite(_describe(node, ind, j, len(extents(node))), n))

    def __len__(self) -> int:
        return len(self.sites)

    def check(self, node: Node, coordinate: int, index: Expr, extent: int) -> Expr | None:
        """The checked position for ``index`` (int64) read by ``node``; None for a node
        whose indices are constant (checked already: the caller only wraps them)."""
        site = self._ids.get((id(node), coordinate))
        return None if site is None else IndexCheck(index, extent, site)


def _describe(node: Node, ind: Value, coordinate: int, coordinates: int) -> str:
    where = f"the indices of {node.op.name} node '{node.origin or node.name}'"
    if coordinates > 1:
        where = f"coordinate {coordinate} of {where}"
    source = _graph_input(ind)
    return f"input '{source.name}' ({where})" if source is not None else where


def _graph_input(v: Value) -> Value | None:
    """The graph input whose elements ``v`` holds unchanged (through moves and widening
    integer casts), or None when ``v`` is computed."""
    while v.producer is not None:
        op = v.producer.op
        src = v.producer.inputs[0]
        moves = isinstance(op, (Reshape, Transpose, Broadcast, Slice))
        a, b = src.type.dtype, v.type.dtype
        # every value of a survives: the same type, or a wider one that is signed if a is
        keeps = a is b or a.itemsize < b.itemsize and (b.is_signed or not a.is_signed)
        widens = isinstance(op, Map) and op.fn is ScalarFn.CAST and a.is_int and b.is_int and keeps
        if not (moves or widens):
            return None
        v = src
    return None if v.is_constant else v


def _check_constant(node: Node, ind: Value) -> None:
    data = np.asarray(ind.data).astype(np.int64)
    ns = extents(node)
    if not ns or not data.size:
        return
    coords = data.reshape(-1, len(ns)) if isinstance(node.op, (GatherND, ScatterND)) else data.reshape(-1, 1)
    for j, n in enumerate(ns):
        bad = (coords[:, j] < -n) | (coords[:, j] >= n)
        if np.any(bad):
            raise GraphError(f"{node.name} ({node.op}, from {node.origin}): constant index {int(coords[bad, j][0])} "
                             f"is outside [-{n}, {n})")

