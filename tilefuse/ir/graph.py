"""The graph IR: values, nodes and graphs, with def-use links.

Values carry a static :class:`TensorType` and, for constants, their data. Nodes apply
one primitive. A graph keeps its nodes in a topological order; networkx views for the
algorithms come from :mod:`tilefuse.ir.algorithms`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from tilefuse.ir.prims import Primitive
from tilefuse.ir.types import TensorType


@dataclass(slots=True, eq=False)
class Value:
    """A tensor: a graph input, a constant (``data`` set) or a node's output."""

    name: str
    type: TensorType
    producer: "Node | None" = None
    users: list["Node"] = field(default_factory=list)
    data: np.ndarray | None = None

    @property
    def is_constant(self) -> bool:
        return self.data is not None

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


@dataclass(slots=True, eq=False)
class Node:
    """One primitive applied to values. ``origin`` names the ONNX node it came from."""

    op: Primitive
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    name: str
    origin: str = ""

    def __repr__(self) -> str:
        return f"Node({self.name}: {self.op})"


@dataclass(slots=True, eq=False)
class Graph:
    """A dataflow graph of primitives with named inputs and outputs.

    ``outputs`` maps each graph output name to its value; a value may be an output
    under several names, and may be an input or a constant itself.
    """

    name: str
    inputs: list[Value] = field(default_factory=list)
    outputs: dict[str, Value] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    opset: int = 0

    def constants(self) -> list[Value]:
        """Constant values that some node reads or that are outputs, in first-use order."""
        seen: dict[int, Value] = {}
        for node in self.nodes:
            for v in node.inputs:
                if v.is_constant:
                    seen.setdefault(id(v), v)
        for v in self.outputs.values():
            if v.is_constant:
                seen.setdefault(id(v), v)
        return list(seen.values())

    def values(self) -> Iterator[Value]:
        yield from self.inputs
        yield from self.constants()
        for node in self.nodes:
            yield from node.outputs

    def remove_dead_nodes(self) -> int:
        """Drop nodes no output depends on; returns how many were removed."""
        live: set[int] = {id(v) for v in self.outputs.values()}
        kept: list[Node] = []
        for node in reversed(self.nodes):
            if any(id(v) in live for v in node.outputs):
                kept.append(node)
                live.update(id(v) for v in node.inputs)
            else:
                for v in node.inputs:
                    v.users[:] = [u for u in v.users if u is not node]
        removed = len(self.nodes) - len(kept)
        self.nodes = kept[::-1]
        return removed

    def __str__(self) -> str:
        from tilefuse.ir.printer import format_graph

        return format_graph(self)
