"""tilefuse CPU plans against onnxruntime (all graph optimisations, same thread count).

    python benchmarks/cpu_vs_onnxruntime.py [--configs tiny real] [--only NAME ...] [--threads N] [--out benchmarks/RESULTS.md]

For every zoo model (float32): compile the plan, time tilefuse and onnxruntime on the
same random inputs, the two in turn in blocks of about 0.2 s (a machine whose speed drifts
moves both alike; ``tilefuse.bench.measure_interleaved``), median and p99 of at least
``--repeats`` runs and ``--seconds`` of each after warm-up, and report the ratio of
the medians and its geometric mean over the float models (a quantized model, such as
bert-qdq, is listed but left out of the mean: it is compared with onnxruntime's int8
kernels, not a float model's). Results are appended to the Markdown file with date and machine.
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import onnxruntime as ort  # noqa: E402

import models  # noqa: E402
from tilefuse.bench import measure_interleaved  # noqa: E402
from tilefuse.compiler import compile  # noqa: E402
from tilefuse.runtime import InferenceSession  # noqa: E402

REAL = ["bert", "gpt2", "llama", "vit", "resnet", "mobilenetv2", "efficientnet", "bert-qdq"]  # issue 18's real sizes


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", nargs="+", default=["tiny"])
    ap.add_argument("--only", nargs="+")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=2.0, help="timed seconds of each runtime, at least (default 2)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "RESULTS.md"))
    ap.add_argument("--threads", type=int, help="threads for both (default: every core)")
    args = ap.parse_args()
    threads = args.threads or os.cpu_count() or 1
    rows = []
    for config in args.configs:
        names = [n for n, s in models.ZOO.items() if s.runs_in_ort and config in s.configs]
        if config == "real":
            names = [n for n in names if n in REAL]
        for name in args.only or names:
            path = models.build(name, config, "float32")
            shapes = models.ZOO[name].shapes(config)
            session = InferenceSession(compile(path, "cpu", shapes), threads=threads)
            feeds = models.random_inputs(path, shapes, seed=0)
            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            ref = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
            # in turn, blocks of about 0.2 s each: the box's speed drifts, and moves both alike
            t, r = measure_interleaved([lambda: session.run(None, feeds), lambda: ref.run(None, feeds)],
                                       repeats=args.repeats, min_seconds=args.seconds, max_repeats=10**6)
            rows.append((name, config, t.median_ms, r.median_ms, t.median_ms / r.median_ms, t.p99_ms, r.p99_ms))
            print(f"{name:22s} {config:5s} tilefuse {t}  onnxruntime {r}  ratio {t.median_ms / r.median_ms:.2f}", flush=True)
    floats = [x for x in rows if models.ZOO[x[0]].family != "quantized"]
    geo = math.exp(sum(math.log(x[4]) for x in floats) / len(floats)) if floats else float("nan")
    print(f"geometric mean ratio of the float models (tilefuse / onnxruntime): {geo:.2f}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [
        f"\n## {datetime.date.today()} — CPU plans vs onnxruntime {ort.__version__} ({commit})\n",
        f"Machine: {cpu_name()}, {threads} threads for both. Command: `python benchmarks/cpu_vs_onnxruntime.py "
        f"--configs {' '.join(args.configs)}{f' --threads {threads}' if args.threads else ''}`. Median and p99 latency (ms), "
        "the two timed in turn in blocks of about 0.2 s.\n",
        "| model | config | tilefuse | onnxruntime | ratio | tilefuse p99 | onnxruntime p99 |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines += [f"| {n} | {c} | {t:.3f} | {r:.3f} | {q:.2f} | {tp:.3f} | {rp:.3f} |" for n, c, t, r, q, tp, rp in rows]
    lines.append(f"\nGeometric mean ratio of the float models: **{geo:.2f}** (lower is better; 1.0 = parity).\n")
    with open(args.out, "a") as f:
        f.write("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
