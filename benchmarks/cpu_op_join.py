"""tilefuse's kernels beside the onnxruntime nodes they replace: where a model's gap is.

    tilefuse profile PLAN --threads N --json tf.json
    python benchmarks/ort_op_profile.py MODEL.onnx --threads N --json ort.json
    python benchmarks/cpu_op_join.py tf.json ort.json [--top 25]

Each row of the tilefuse profile (a kernel with every step that launches it) is put beside
the sum of onnxruntime's median times for the ONNX nodes it covers. onnxruntime renames
some nodes when it fuses them (a suffix such as ``_output_0``, a prefix naming the fusion);
a name that is not a node of the profile is given to the longest node name it contains,
and what still matches nothing is printed as one line. Rows are sorted by the time
tilefuse spends over onnxruntime, largest first: the kernels to look at.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def _owner(name: str, nodes: set[str], by_length: list[str]) -> str | None:
    if name in nodes:
        return name
    for suffix in ("_output_0",):
        if name.endswith(suffix) and name[: -len(suffix)] in nodes:
            return name[: -len(suffix)]
    for node in by_length:  # the longest node name the fused name contains
        if node in name:
            return node
    return None


def join(tf: dict, ort: dict) -> tuple[list[dict], float]:
    """Rows of {name, calls, tf_us, ort_us, covers}, and onnxruntime's unmatched time."""
    node_row: dict[str, int] = {}
    for i, row in enumerate(tf["rows"]):
        for node in row["onnx_nodes"]:
            node_row[node] = i
    nodes = set(node_row)
    by_length = sorted((n for n in nodes if len(n) > 3), key=len, reverse=True)
    ort_us = [0.0] * len(tf["rows"])
    unmatched = 0.0
    for name, entry in ort.items():
        owner = _owner(name, nodes, by_length)
        if owner is None:
            unmatched += entry["us"]
        else:
            ort_us[node_row[owner]] += entry["us"]
    rows = [{"name": r["name"], "calls": len(r["steps"]), "tf_us": r["total_ms"] * 1e3, "ort_us": ort_us[i],
             "covers": r["covers"]} for i, r in enumerate(tf["rows"])]
    rows.sort(key=lambda r: r["tf_us"] - r["ort_us"], reverse=True)
    return rows, unmatched


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tilefuse_profile", help="`tilefuse profile --json` output")
    ap.add_argument("ort_profile", help="`benchmarks/ort_op_profile.py --json` output")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    tf = json.loads(Path(args.tilefuse_profile).read_text())
    ort = json.loads(Path(args.ort_profile).read_text())
    rows, unmatched = join(tf, ort)
    print(f"{'tilefuse us':>11} {'ort us':>9} {'over':>9} {'ratio':>6} {'calls':>5}  kernel / ONNX nodes")
    for r in rows[: args.top]:
        ratio = f"{r['tf_us'] / r['ort_us']:.2f}" if r["ort_us"] else "-"
        print(f"{r['tf_us']:>11.1f} {r['ort_us']:>9.1f} {r['tf_us'] - r['ort_us']:>9.1f} {ratio:>6} {r['calls']:>5}"
              f"  {r['name'][:44]:<44} {r['covers'][:60]}")
    tf_sum = sum(r["tf_us"] for r in rows)
    ort_sum = sum(r["ort_us"] for r in rows) + unmatched
    print(f"{tf_sum:>11.1f} {ort_sum:>9.1f} {tf_sum - ort_sum:>9.1f} {tf_sum / ort_sum:>6.2f}        all rows "
          f"(onnxruntime nodes matching none: {unmatched:.1f} us)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
