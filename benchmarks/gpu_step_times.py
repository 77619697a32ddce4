"""Each kernel's device time in packed real-size plans, summed per kernel over the plan's
steps: where a plan's time goes, on the GPU machine.

    python benchmarks/gpu_peers.py pack --models resnet --batches 1 32      # here
    PYTHONPATH=. python benchmarks/gpu_step_times.py build/gpu_real/resnet-float16-b1.tfplan ... [--repeats 50]

Weights are synthesised as gpu_peers does. Per plan: the graph replay's median, then per
kernel its launches, the median over its steps of one launch's time (CUDA events around
``--repeats`` back-to-back launches of each step, the runtime's ``timed_steps``), their sum, its share of the summed step times, and the
schedule the plan records for it (tiles, threads, grid). JSON to $OUT/gpu_step_times.json
when $OUT is set.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    from gpu_peers import prepare

    ap = argparse.ArgumentParser()
    ap.add_argument("plans", nargs="+", type=Path)
    ap.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()
    report = []
    for plan_dir in args.plans:
        sess, feeds = prepare(plan_dir)
        sess.run(None, feeds)
        ex = sess._executor
        replay = statistics.median(ex.timed(args.repeats))
        manifest = json.loads((plan_dir / "manifest.json").read_text())
        kernels = {k["name"]: k for k in manifest["kernels"]}
        times: dict[str, list[float]] = defaultdict(list)  # per kernel: seconds of each step that launches it
        for name, ms in ex.timed_steps(args.repeats):
            times[name].append(ms / 1e3)
        rows = []
        launches = {name: len(v) for name, v in times.items()}
        total = sum(statistics.median(v) * launches[n] for n, v in times.items())
        for name, v in sorted(times.items(), key=lambda kv: -statistics.median(kv[1]) * launches[kv[0]]):
            k = kernels.get(name, {})
            s, launch = k.get("schedule", {}), k.get("launch", {})
            one = statistics.median(v)
            rows.append({"kernel": name, "launches": launches[name], "us": 1e6 * one,
                         "sum_us": 1e6 * one * launches[name], "share": one * launches[name] / total,
                         "grid": launch.get("grid"), "block": launch.get("block"),
                         "tiles": [s.get("tile_m"), s.get("tile_n"), s.get("tile_k")], "mnk": [s.get("m"), s.get("n"), s.get("k")]})
        print(f"{plan_dir.name}: replay {replay:.3f} ms, steps summed {1e3 * total:.3f} ms")
        for r in rows:
            blocks = math.prod(r["grid"]) if r["grid"] else 0
            print(f"  {r['kernel'][:30]:30s} x{r['launches']:<2d} {r['us']:8.1f} us  sum {r['sum_us']:8.1f}  {100 * r['share']:5.1f}%"
                  f"  mnk {r['mnk']} tiles {r['tiles']} blocks {blocks} x {r['block'][0] if r['block'] else '-'}")
        report.append({"plan": plan_dir.name, "replay_ms": replay, "steps_ms": 1e3 * total, "kernels": rows})
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_step_times.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
