"""`tilefuse ops`: the supported-op table, straight from the converter registry."""
from __future__ import annotations

import argparse
import json

from tilefuse.frontend import registry


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ops", help="list the ONNX ops tilefuse supports")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--markdown", action="store_true", help="the README's table")
    p.set_defaults(func=run)


def op_rows() -> list[dict[str, object]]:
    rows = []
    for e in registry.entries():
        rows.append({
            "domain": e.domain or "ai.onnx",
            "op_type": e.op_type,
            "since": e.since,
            "until": e.until,
            "family": e.fn.__module__.rsplit(".", 1)[-1],
            "note": e.note,
        })
    return rows


def markdown_table(rows: list[dict[str, object]]) -> str:
    by_family: dict[str, list[str]] = {}
    for r in rows:
        span = f"{r['since']}+" if r["until"] is None else f"{r['since']}-{r['until']}"
        by_family.setdefault(str(r["family"]), []).append(f"{r['op_type']} ({span})")
    ops = len({(r["domain"], r["op_type"]) for r in rows})
    lines = [f"{ops} ONNX ops (opset ranges in brackets; models below opset 13 are upgraded first).", "",
             "| family | ops |", "| --- | --- |"]
    for family, names in sorted(by_family.items()):
        lines.append(f"| {family} | {', '.join(names)} |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    rows = op_rows()
    if args.json:
        print(json.dumps(rows, indent=1))
    elif args.markdown:
        print(markdown_table(rows))
    else:
        for r in rows:
            span = f"{r['since']}+" if r["until"] is None else f"{r['since']}-{r['until']}"
            print(f"{r['domain']:<10} {r['op_type']:<28} opset {span:<8} {r['family']}")
        print(f"{len({(r['domain'], r['op_type']) for r in rows})} ops")
    return 0
