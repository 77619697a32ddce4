"""How fast the partitioner is, and what it makes of the real-size zoo models.

    python benchmarks/partition_speed.py [--models bert gpt2 resnet] [--repeats 5] [--json FILE]

Builds each model's `real` config into the zoo cache if needed (minutes the first time),
imports it once, then partitions it ``--repeats`` times for the cuda:sm_90a target and
reports the median time, kernels and fused/unfused bytes, for each target in ``--targets``
(default: cpu, the default of `tilefuse optimize`, and cuda:sm_90a).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import models  # noqa: E402
from tilefuse.frontend import import_onnx  # noqa: E402
from tilefuse.frontend.loader import load_model  # noqa: E402
from tilefuse.partition import partition_graph  # noqa: E402
from tilefuse.partition.summary import summarize_partition  # noqa: E402
from tilefuse.target import get_target  # noqa: E402

SHAPES = {
    "bert": [{"batch": 1, "seq": 128}, {"batch": 32, "seq": 128}],
    "gpt2": [{"batch": 1, "seq": 128}, {"batch": 32, "seq": 128}],
    "resnet": [None],
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["bert"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--targets", nargs="+", default=["cpu", "cuda:sm_90a"])
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    rows = []
    for name in args.models:
        path = models.build(name, "real", "float32")
        onnx_nodes = len(load_model(path).graph.node)
        for shapes in SHAPES.get(name, [None]):
            shapes = shapes or models.ZOO[name].shapes("real")
            t0 = time.perf_counter()
            graph = import_onnx(path, shapes)
            import_s = time.perf_counter() - t0
            for target in map(get_target, args.targets):
                times = []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    p = partition_graph(graph, target)
                    times.append(time.perf_counter() - t0)
                s = summarize_partition(p, onnx_nodes)
                row = {
                    "model": name, "shapes": shapes, "target": target.name, "primitives": len(graph.nodes),
                    "kernels": s["kernels"],
                    "fused_over_unfused_bytes": round(s["fused_bytes"] / s["unfused_bytes"], 3),
                    "partition_s_median": round(statistics.median(times), 3), "partition_s_max": round(max(times), 3),
                    "import_s": round(import_s, 2),
                }
                rows.append(row)
                print(json.dumps(row))
    print(f"machine: {platform.machine()} {platform.processor() or ''} python {platform.python_version()}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
