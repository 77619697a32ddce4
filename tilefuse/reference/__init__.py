"""The reference executor: runs a graph primitive by primitive with numpy.

It is the oracle every later stage is tested against, and it is tested against
onnxruntime. Intermediates are freed after their last use.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from tilefuse.errors import ExecutionError
from tilefuse.feeds import check_feeds
from tilefuse.ir.graph import Graph

__all__ = ["ExecutionError", "evaluate_all", "run_graph"]


def run_graph(
    graph: Graph, feeds: Mapping[str, object], output_names: Sequence[str] | None = None
) -> dict[str, np.ndarray]:
    arrays = check_feeds([(v.name, v.type) for v in graph.inputs], feeds)
    names = list(graph.outputs) if output_names is None else list(output_names)
    for n in names:
        if n not in graph.outputs:
            raise ExecutionError(f"unknown output {n!r}; the graph's outputs are {list(graph.outputs)}")
    env: dict[int, np.ndarray] = {id(v): arrays[v.name] for v in graph.inputs}
    wanted = {id(graph.outputs[n]) for n in names}
    last_use = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            last_use[id(v)] = i
    for i, node in enumerate(graph.nodes):
        args = [v.data if v.data is not None else env[id(v)] for v in node.inputs]
        try:
            results = node.op.evaluate(args)
        except (IndexError, ValueError, TypeError) as e:
            raise ExecutionError(f"{node.name} ({node.op}, from {node.origin}): {e}") from e
        for v, r in zip(node.outputs, results):
            env[id(v)] = r
        for v in node.inputs:
            if last_use.get(id(v)) == i and id(v) not in wanted and not v.is_constant:
                env.pop(id(v), None)
    out = {}
    for n in names:
        v = graph.outputs[n]
        out[n] = np.array(v.data) if v.is_constant else env[id(v)]
    return out


def evaluate_all(graph: Graph, feeds: Mapping[str, object]) -> dict[int, np.ndarray]:
    """Every value of the graph (keyed by ``id(value)``), for testing stages piecewise."""
    arrays = check_feeds([(v.name, v.type) for v in graph.inputs], feeds)
    env: dict[int, np.ndarray] = {id(v): arrays[v.name] for v in graph.inputs}
    for node in graph.nodes:
        args = [v.data if v.data is not None else env[id(v)] for v in node.inputs]
        for v, r in zip(node.outputs, node.op.evaluate(args)):
            env[id(v)] = r
    return env
