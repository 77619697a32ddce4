"""Cutting an ONNX model at the node level: what tilefuse claims, what stays with ORT.

tilefuse's own frontend refuses a model with any op it cannot convert. Inside
onnxruntime that is not necessary: a node tilefuse cannot run stays an ordinary ONNX
node for ORT's providers. This module decides, per ONNX node, claimed or kept, and
groups the claimed nodes into regions that tilefuse compiles one at a time.

A region must be convex (no path leaves it through a kept node and comes back), or the
stitched model would have a cycle. Numbering each node with the most kept nodes on any
path from the graph inputs to it (a kept node counts for the nodes after it) gives that:
along a path the number never falls, and it rises past every kept node, so the claimed
nodes sharing a number form convex regions.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import onnx

from tilefuse.frontend.coverage import find_unsupported


@dataclass(frozen=True)
class KeptNode:
    """An ONNX node left to onnxruntime, and why."""

    name: str
    op_type: str
    domain: str
    reason: str

    def __str__(self) -> str:
        domain = f"{self.domain}::" if self.domain not in ("", "ai.onnx") else ""
        return f"{self.name} ({domain}{self.op_type}): {self.reason}"


def name_nodes(model: onnx.ModelProto) -> None:
    """Give every top-level node a unique name (in place): regions and reports use them."""
    taken = {n.name for n in model.graph.node if n.name}
    seen: set[str] = set()
    for i, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            base = f"{node.op_type}_{i}"
            name, k = base, 0
            while name in taken or name in seen:
                k += 1
                name = f"{base}_{k}"
            node.name = name
        seen.add(node.name)


def unsupported_nodes(model: onnx.ModelProto) -> dict[str, str]:
    """Top-level node name -> why tilefuse has no converter for it (nodes must be named)."""
    out: dict[str, str] = {}
    for op in find_unsupported(model):
        why = op.reason if op.reason and op.reason != "no converter" else "no tilefuse converter"
        for label in op.nodes:
            top = label.split("/", 1)[0]  # a node inside a subgraph: its If/Loop stays whole
            out.setdefault(top, f"{why} ({op.domain or 'ai.onnx'}::{op.op_type}, opset {op.opset})")
    return out


def node_reads(node: onnx.NodeProto) -> Iterator[str]:
    """Every value name a node reads, including those its subgraphs take from outside."""
    yield from (n for n in node.input if n)
    for attr in node.attribute:
        for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
            # what the subgraph defines itself is no read from outside
            local = {o for sub in g.node for o in sub.output} | {t.name for t in g.initializer} | {i.name for i in g.input}
            for sub in g.node:
                yield from (n for n in node_reads(sub) if n not in local)


def regions(model: onnx.ModelProto, kept: Iterable[str]) -> list[list[onnx.NodeProto]]:
    """The claimed nodes (those not in ``kept``) as convex regions, in an order in which
    they can run; each region's nodes keep the model's (topological) order."""
    kept = set(kept)
    producer: dict[str, str] = {}
    level: dict[str, int] = {}
    by_level: dict[int, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        lv = 0
        for name in node_reads(node):
            p = producer.get(name)
            if p is not None:
                lv = max(lv, level[p] + (p in kept))
        level[node.name] = lv
        for out in node.output:
            if out:
                producer[out] = node.name
        if node.name not in kept:
            by_level.setdefault(lv, []).append(node)
    return [by_level[lv] for lv in sorted(by_level)]
