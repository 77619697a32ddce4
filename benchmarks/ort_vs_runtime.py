"""tilefuse kernels inside onnxruntime against the tilefuse runtime, for the same plan.

    python benchmarks/ort_vs_runtime.py [--only NAME ...] [--rounds N] [--out benchmarks/RESULTS.md]

For every tiny zoo model (float32): ``export_ort`` compiles it (one region: the whole
model, since the zoo is fully supported) and writes the EPContext model and the
custom-op model; the tilefuse runtime runs the very plan the export was stitched from.
The three are timed interleaved, call by call in rotating order on the same random
inputs, so that load from other processes falls on all three alike (median and p10-p90
after warm-up). The ratio
ORT+EP / runtime is the overhead of running the kernels under onnxruntime (goal: within
15%). Results are appended to the Markdown file with date and machine.
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import onnxruntime as ort  # noqa: E402

import models  # noqa: E402
from benchmarks.cpu_vs_onnxruntime import cpu_name  # noqa: E402
from tilefuse.bench import Timing  # noqa: E402
from tilefuse.ort import export_ort, session_options  # noqa: E402
from tilefuse.runtime import InferenceSession  # noqa: E402


def ort_options(threads: int) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    # The kernels parallelise themselves (OpenMP); ORT's pool spinning beside them would steal the cores.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


def interleaved(fns, rounds: int, warmup: int = 5) -> list[Timing]:
    """Time each of ``fns`` ``rounds`` times, one call of each per round, in rotating order."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    times: list[list[float]] = [[] for _ in fns]
    for r in range(rounds):
        for k in range(len(fns)):
            i = (r + k) % len(fns)
            t0 = time.perf_counter()
            fns[i]()
            times[i].append((time.perf_counter() - t0) * 1e3)
    out = []
    for ts in times:
        q = statistics.quantiles(ts, n=10)
        out.append(Timing(statistics.median(ts), q[0], q[-1], len(ts)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="+")
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--out", default=str(Path(__file__).parent / "RESULTS.md"))
    args = ap.parse_args()
    threads = os.cpu_count() or 1
    names = args.only or [n for n, s in models.ZOO.items() if s.runs_in_ort]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            path = models.build(name, "tiny", "float32")
            shapes = models.ZOO[name].shapes("tiny")
            ep = export_ort(path, Path(tmp) / f"{name}-ep", "cpu", shapes, "ep")
            ops = export_ort(path, Path(tmp) / f"{name}-ops", "cpu", shapes, "custom-ops")
            if len(ep.plans) != 1:
                print(f"{name}: {len(ep.plans)} regions, skipped (the runtime runs whole plans)")
                continue
            runtime = InferenceSession(ep.plans[0])
            with_ep = ort.InferenceSession(str(ep.model_path), session_options(ort_options(threads)))
            so = ort_options(threads)
            so.register_custom_ops_library(str(ops.library))
            with_ops = ort.InferenceSession(str(ops.model_path), so)
            feeds = models.random_inputs(path, shapes, seed=0)
            t, e, c = interleaved([lambda s=runtime, f=feeds: s.run(None, f),
                                   lambda s=with_ep, f=feeds: s.run(None, f),
                                   lambda s=with_ops, f=feeds: s.run(None, f)], args.rounds)
            rows.append((name, ep.kernel_nodes, t, e, c))
            print(f"{name:22s} kernels {ep.kernel_nodes:3d}  runtime {t}  ORT+EP {e}  ORT+custom ops {c}  "
                  f"EP/runtime {e.median_ms / t.median_ms:.2f}", flush=True)
    geo = {k: math.exp(sum(math.log(r[k].median_ms / r[2].median_ms) for r in rows) / len(rows)) for k in (3, 4)}
    print(f"geometric mean ratio vs runtime: ORT+EP {geo[3]:.2f}, ORT+custom ops {geo[4]:.2f}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()

    def cell(m) -> str:
        return f"{m.median_ms:.3f} ({m.p10_ms:.3f}–{m.p90_ms:.3f})"

    lines = [
        f"\n## {datetime.date.today()} — tilefuse inside onnxruntime {ort.__version__} vs the tilefuse runtime ({commit})\n",
        f"Machine: {cpu_name()}, {threads} threads, no GPU; load average {os.getloadavg()[0]:.1f} at the end "
        "(other work shared the machine: the columns are interleaved, compare ratios). "
        f"Command: `python benchmarks/ort_vs_runtime.py {' '.join(sys.argv[1:])}`. "
        "Latency in ms: median (p10–p90). Same plan in all three columns.\n",
        "| model | kernels | tilefuse runtime | ORT + tilefuse EP | ORT + custom ops | EP / runtime | custom ops / runtime |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines += [f"| {n} | {k} | {cell(t)} | {cell(e)} | {cell(c)} | {e.median_ms / t.median_ms:.2f} | "
              f"{c.median_ms / t.median_ms:.2f} |" for n, k, t, e, c in rows]
    lines.append(f"\nGeometric mean ratio vs the runtime: ORT + EP **{geo[3]:.2f}**, ORT + custom ops "
                 f"**{geo[4]:.2f}** (1.0 = same speed; goal: EP within 1.15).\n")
    with open(args.out, "a") as f:
        f.write("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
