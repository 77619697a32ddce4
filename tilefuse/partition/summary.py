"""The partition as data for people: the summary JSON and the terminal table."""
from __future__ import annotations

import hashlib
from typing import Mapping

from tilefuse import patterns
from tilefuse.partition.cost import unfused_cost
from tilefuse.partition.model import FusedGroup, Partition


def group_summary(g: FusedGroup, p: Partition, onnx_ops: Mapping[str, str] | None = None) -> dict[str, object]:
    t = p.target
    anchor = g.anchor
    ops = onnx_ops or {}
    return {
        "id": g.id,
        "name": g.name,
        # what the kernel is: its pattern (the schedule family its lowering takes), the ONNX
        # op types it covers, and a signature equal for identical kernels (repeated layers)
        "pattern": patterns.pattern_name(g.match) if g.match is not None else str(g.kind),
        "onnx_ops": list(dict.fromkeys(ops[n] for n in g.onnx_nodes if n in ops)),
        "signature": _signature(g),
        "anchor_kind": str(g.kind),
        "anchor": anchor.op.name if anchor is not None else None,
        "primitives": [n.op.name for n in g.nodes],
        "primitive_nodes": [n.name for n in g.nodes],
        "onnx_nodes": g.onnx_nodes,
        "flops": g.cost.flops,
        "bytes_in": g.cost.bytes_in,
        "bytes_out": g.cost.bytes_out,
        "estimated_seconds": g.cost.seconds(t),
        "bound": g.cost.bound(t),
        "inputs": [v.name for v in g.inputs if not v.is_constant],
        "outputs": [v.name for v in g.outputs],
    }


def _signature(g: FusedGroup) -> str:
    """Equal for groups that compute the same primitives on the same types in the same
    order (a transformer's layers): one row in the summary, with a count."""
    parts = [n.op.name for n in g.nodes] + [str(v.type) for v in (*g.inputs, *g.outputs)]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def folded(groups: list[dict]) -> list[list[dict]]:
    """A summary's groups, identical kernels (equal ``signature``) together, the rows with
    the most estimated time first: the summary's table and the report's."""
    rows: dict[str, list[dict]] = {}
    for g in groups:
        rows.setdefault(str(g.get("signature", g["id"])), []).append(g)
    return sorted(rows.values(), key=lambda gs: -sum(g["estimated_seconds"] for g in gs))


def summarize_partition(p: Partition, onnx_nodes: int, onnx_ops: Mapping[str, str] | None = None) -> dict[str, object]:
    repeats = {id(n) for n in p.recomputed}  # an unfused runtime computes each value once
    unfused = unfused_cost(n for n in p.graph.nodes if id(n) not in repeats)
    fused_bytes = sum(g.cost.bytes for g in p.groups)
    return {
        "target": p.target.name,
        "onnx_nodes": onnx_nodes,
        "primitives": len(p.graph.nodes) - len(repeats),
        "recomputed": len(repeats),
        "kernels": len(p.groups),
        "opaque_kernels": sum(1 for g in p.groups if str(g.kind) == "opaque"),
        "unfused_bytes": unfused.bytes,
        "fused_bytes": fused_bytes,
        "unfused_estimated_seconds": unfused.seconds(p.target),
        "fused_estimated_seconds": sum(g.cost.seconds(p.target) for g in p.groups),
        "flops": sum(g.cost.flops for g in p.groups),
        "groups": [group_summary(g, p, onnx_ops) for g in p.groups],
        "refusals": [
            {"a": r.group_a, "b": r.group_b, "node_a": r.node_a, "node_b": r.node_b, "reason": r.reason}
            for r in p.refusals
        ],
    }


def _human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def format_summary(s: dict[str, object], top: int = 10) -> str:
    groups: list[dict] = s["groups"]  # type: ignore[assignment]
    ratio = float(s["fused_bytes"]) / max(1.0, float(s["unfused_bytes"]))  # type: ignore[arg-type]
    lines = [
        f"target {s['target']}: {s['onnx_nodes']} ONNX nodes -> {s['primitives']} primitives -> {s['kernels']} kernels"
        + (f" ({s['opaque_kernels']} opaque)" if s["opaque_kernels"] else ""),
        f"memory traffic: {_human_bytes(s['unfused_bytes'])} unfused -> {_human_bytes(s['fused_bytes'])} fused ({ratio:.0%})",  # type: ignore[arg-type]
        f"estimated time: {s['unfused_estimated_seconds'] * 1e6:.1f} us unfused -> {s['fused_estimated_seconds'] * 1e6:.1f} us fused",  # type: ignore[operator]
    ]
    if s.get("recomputed"):
        lines.append(f"{s['recomputed']} primitives recomputed in a second kernel (widening casts)")
    rows = folded(groups)  # identical kernels (repeated layers) as one row
    lines += [
        "top kernels by estimated time" + (" (identical kernels folded)" if len(rows) < len(groups) else "") + ":",
        f"  {'ids':<10} {'pattern':<9} {'what':<40} {'x':>3} {'us each':>8} {'us total':>9}  bound    bytes each",
    ]
    for gs in rows[:top]:
        g = gs[0]
        ids = ",".join(str(x["id"]) for x in gs)
        ids = ids if len(ids) <= 10 else f"{gs[0]['id']},..{gs[-1]['id']}"
        what = "+".join(g.get("onnx_ops") or g["primitives"])
        what = what if len(what) <= 40 else what[:39] + "…"
        each = g["estimated_seconds"] * 1e6
        lines.append(
            f"  {ids:<10} {str(g.get('pattern', g['anchor_kind'])):<9} {what:<40} {len(gs):>3} {each:>8.2f} "
            f"{each * len(gs):>9.2f}  {g['bound']:<8} {_human_bytes(g['bytes_in'] + g['bytes_out'])}"
        )
    return "\n".join(lines)


def format_explain(p: Partition) -> str:
    lines = [f"why neighbouring kernels stayed apart ({len(p.refusals)} pairs):"]
    for r in p.refusals:
        lines.append(f"  k{r.group_a} -> k{r.group_b} ({r.node_a} -> {r.node_b}): {r.reason}")
    return "\n".join(lines)
