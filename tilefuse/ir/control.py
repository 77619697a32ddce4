"""Control flow in the graph IR: a branch between two graphs on a run-time condition.

An ONNX ``If`` whose condition is known at compile time never gets here: the frontend
inlines the branch taken. What is left is a condition computed from the inputs, and
``Branch`` holds both branches as graphs of their own. It is opaque to the partitioner
(a group of one, never fused); the compiler compiles each branch graph on its own and
the linker lays both out as steps of the same plan (``BranchStep``, ``SelectStep``).

Not in ``tilefuse.ir.prims``: a branch holds graphs, so no plan can name it as a host
step (``plan.hostops`` allow-lists that package's opaque primitives only).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tilefuse.ir.dtypes import DType
from tilefuse.ir.graph import Graph
from tilefuse.ir.prims.base import Kind, Primitive
from tilefuse.ir.types import TensorType


@dataclass(frozen=True, slots=True, eq=False)
class Branch(Primitive):
    """``then_graph`` if the condition holds, else ``else_graph``.

    Inputs: the condition (a bool tensor of one element), then the outer values the
    branches read, bound in order to each branch graph's inputs (both graphs take the
    same list; a branch may leave some unread). Outputs: the branch's outputs, which
    must have the same types in both graphs. Equality is identity (graphs are mutable).
    """

    then_graph: Graph
    else_graph: Graph
    kind = Kind.OPAQUE

    def infer(self, inputs: Sequence[TensorType]) -> tuple[TensorType, ...]:
        if not inputs:
            raise TypeError("Branch takes the condition and the values its branches read")
        cond, *outer = inputs
        if cond.dtype is not DType.BOOL or cond.size != 1:
            raise ValueError(f"branch: the condition must be one bool, got {cond}")
        for label, g in (("then", self.then_graph), ("else", self.else_graph)):
            types = [v.type for v in g.inputs]
            if types != list(outer):
                raise ValueError(f"branch: the {label} graph takes {[str(t) for t in types]}, "
                                 f"but is given {[str(t) for t in outer]}")
        then_types = tuple(v.type for v in self.then_graph.outputs.values())
        else_types = tuple(v.type for v in self.else_graph.outputs.values())
        if then_types != else_types:
            raise ValueError(f"branch: the branches give {[str(t) for t in then_types]} and "
                             f"{[str(t) for t in else_types]}")
        return then_types

    def evaluate(self, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        cond, *outer = inputs
        return run_branch(self.then_graph if bool(np.asarray(cond).reshape(-1)[0]) else self.else_graph, outer)

    def flops(self, inputs: Sequence[TensorType], outputs: Sequence[TensorType]) -> int:
        return max(_graph_flops(self.then_graph), _graph_flops(self.else_graph))

    def params(self) -> dict[str, object]:
        return {"then": f"{len(self.then_graph.nodes)} nodes", "else": f"{len(self.else_graph.nodes)} nodes"}


def run_branch(graph: Graph, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
    """``graph``'s outputs on ``inputs`` (bound to its inputs in order), node by node with
    each primitive's numpy reference."""
    env: dict[int, np.ndarray] = {id(v): np.asarray(a) for v, a in zip(graph.inputs, inputs, strict=True)}
    for node in graph.nodes:
        args = [v.data if v.is_constant else env[id(v)] for v in node.inputs]
        for v, r in zip(node.outputs, node.op.evaluate(args)):  # type: ignore[arg-type]
            env[id(v)] = r
    return tuple(np.array(v.data) if v.is_constant else env[id(v)] for v in graph.outputs.values())


def _graph_flops(graph: Graph) -> int:
    return sum(n.op.flops([v.type for v in n.inputs], [v.type for v in n.outputs]) for n in graph.nodes)
