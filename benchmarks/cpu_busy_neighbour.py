"""CPU plans beside a busy neighbour: tilefuse and onnxruntime, quiet, then with a core taken.

    python benchmarks/cpu_busy_neighbour.py [--models bert:tiny bert:real | tiny ...] [--threads 2]
        [--seconds 20] [--phases quiet busy] [--neighbours 1] [--pin CPU]
        [--save-plans DIR] [--baseline DIR] [--json FILE] [--out FILE.md]

For each model (zoo NAME:CONFIG, float32; ``tiny``: every tiny zoo model onnxruntime runs)
it compiles the CPU plan, then times tilefuse (``InferenceSession(plan, threads=N)``) and
onnxruntime (``intra_op_num_threads=N``, all graph optimisations) on the same random
inputs: first quiet, then while ``--neighbours`` processes each burn a core (a busy loop
that stops by itself at a deadline, pinned to ``--pin CPU`` or placed by the scheduler).
The runtimes take turns in blocks of about half a second, each block after one untimed run,
so all see the same conditions and none runs while another's idle threads still spin.
Reported per runtime and phase: median, p99, p10, mean and the number of runs; and each
runtime's busy p99 over its quiet median (the goal for tilefuse: at most 2).

Before/after comparisons: ``--save-plans DIR`` writes each plan as DIR/NAME-CONFIG.tfplan;
``--baseline DIR`` also times the plans found there (label "baseline"), in the same turns.
A baseline from another commit: ``tilefuse optimize`` there, e.g. ``git archive OLD | tar -x
-C /tmp/old && cd /tmp/old && python -m tilefuse optimize MODEL.onnx --shape batch=1 --shape
seq=128 -o DIR/bert-real.tfplan`` (plans built before the thread pool run on libgomp; they
get the thread count through omp_set_num_threads).

Also recorded, so that a reader can tell what ran: the thread count each runtime ran with
(``session.threads``, onnxruntime's session options), what ran tilefuse's parallel loops
(its own pool; "openmp" for kernels built before it, on libgomp, where ``GOMP_SPINCOUNT``
and ``OMP_WAIT_POLICY`` apply and are recorded), and how much CPU other processes used during
each phase, in cores (a quiet phase on a shared machine is not quiet: the figure shows it).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import onnxruntime as ort  # noqa: E402

import models  # noqa: E402
from tilefuse.compiler import compile  # noqa: E402
from tilefuse.runtime import InferenceSession  # noqa: E402
from cpu_vs_onnxruntime import cpu_name  # noqa: E402  (one reading of the machine's name)

# The neighbour: a busy loop until its deadline (so it cannot outlive a killed benchmark
# by more than that), optionally pinned to one CPU.
BURN = """
import os, sys, time
deadline, pin = time.monotonic() + float(sys.argv[1]), int(sys.argv[2])
if pin >= 0:
    os.sched_setaffinity(0, {pin})
x = 0
while time.monotonic() < deadline:
    for _ in range(100000):
        x += 1
"""
BLOCK_S = 0.5  # a turn of one runtime
MIN_RUNS = 20  # per runtime and phase, whatever --seconds says
OMP_VARS = ("OMP_NUM_THREADS", "GOMP_SPINCOUNT", "OMP_WAIT_POLICY")


@dataclass
class Stats:
    median_ms: float
    p99_ms: float
    p10_ms: float  # the good runs: on a shared machine, closer to what a quiet one gives
    mean_ms: float  # the time per run over the phase: what the stalls cost in throughput
    max_ms: float
    runs: int

    @staticmethod
    def of(times: list[float]) -> "Stats":
        a = np.asarray(times)
        return Stats(float(np.median(a)), float(np.percentile(a, 99)), float(np.percentile(a, 10)), float(a.mean()),
                     float(a.max()), len(a))


class CpuMeter:
    """CPU used by other processes, in cores, between ``start()`` and ``stop()``."""

    def start(self) -> None:
        self._t, self._busy, self._own = time.monotonic(), _machine_busy_s(), _own_cpu_s()

    def stop(self) -> float:
        elapsed = time.monotonic() - self._t
        others = (_machine_busy_s() - self._busy) - (_own_cpu_s() - self._own)
        return max(0.0, others / elapsed) if elapsed > 0 else float("nan")


def _machine_busy_s() -> float:
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return float("nan")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def time_in_turns(runners: dict[str, Callable[[], object]], seconds: float) -> dict[str, list[float]]:
    """Each runner for ``seconds`` in all (and at least MIN_RUNS runs), in alternating
    blocks of about BLOCK_S; the first run of each block is not timed."""
    times: dict[str, list[float]] = {name: [] for name in runners}
    spent = dict.fromkeys(runners, 0.0)

    def more(name: str) -> bool:
        return spent[name] < seconds or len(times[name]) < MIN_RUNS

    while any(more(n) for n in runners):
        for name, fn in runners.items():
            if not more(name):
                continue
            fn()
            block_start = time.perf_counter()
            while time.perf_counter() - block_start < BLOCK_S:
                t0 = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - t0) * 1e3)
            spent[name] += time.perf_counter() - block_start
    return times


def start_neighbours(count: int, pin: int | None, seconds: float) -> list[subprocess.Popen]:
    procs = [subprocess.Popen([sys.executable, "-c", BURN, str(seconds), str(-1 if pin is None else pin)])
             for _ in range(count)]
    time.sleep(0.5)  # let them start burning
    return procs


def stop_neighbours(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def build_models(specs: list[tuple[str, str]]) -> None:
    """Build any zoo model not cached yet, in a subprocess: building imports torch, whose
    threads have no business in the measurement."""
    for name, config in specs:
        if not models.model_path(name, config, "float32").exists():
            subprocess.run([sys.executable, "-m", "models", "build", "--only", name, "--config", config,
                            "--dtype", "float32"], cwd=ROOT, check=True)


def bench_model(name: str, config: str, args: argparse.Namespace) -> dict:
    path = models.build(name, config, "float32")  # cached by build_models: no torch here
    shapes = models.ZOO[name].shapes(config)
    plan = compile(path, "cpu", shapes)
    if args.save_plans:
        plan.save(Path(args.save_plans) / f"{name}-{config}.tfplan")
    sessions = {"tilefuse": InferenceSession(plan, threads=args.threads)}
    baseline = Path(args.baseline or "") / f"{name}-{config}.tfplan"
    if args.baseline and baseline.is_dir():
        sessions["baseline"] = InferenceSession(baseline, threads=args.threads)
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads  # tilefuse's count may be less: 1 when no kernel is parallel
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    ref = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    feeds = models.random_inputs(path, shapes, seed=0)
    runners: dict[str, Callable[[], object]] = {n: (lambda s=s: s.run(None, feeds)) for n, s in sessions.items()}
    runners["onnxruntime"] = lambda: ref.run(None, feeds)
    for fn in runners.values():  # warm up: first touch of arenas, onnxruntime's allocator
        fn()
    result: dict = {
        "model": f"{name}:{config}",
        "threads": {**{n: s.threads for n, s in sessions.items()},
                    "onnxruntime": ref.get_session_options().intra_op_num_threads},
        "pool": {n: s._executor.thread_pool for n, s in sessions.items()},
    }
    meter = CpuMeter()
    for phase in args.phases:
        busy = phase == "busy"
        procs = start_neighbours(args.neighbours, args.pin, 2 * args.seconds * len(runners) + 120) if busy else []
        try:
            meter.start()
            times = time_in_turns(runners, args.seconds)
            others = meter.stop()
        finally:
            stop_neighbours(procs)
        result[phase] = {n: asdict(Stats.of(t)) for n, t in times.items()}
        result[phase]["other_cores_busy"] = round(others, 2)
    if "quiet" in result and "busy" in result:
        result["busy_p99_over_quiet_median"] = {
            n: result["busy"][n]["p99_ms"] / result["quiet"][n]["median_ms"] for n in runners}
    return result


def _line(r: dict, n: str) -> str:
    pool = f", {r['pool'][n]}" if n in r["pool"] else ""
    cells = [f"{r['model']:16s} {n:11s} ({r['threads'][n]} threads{pool})"]
    for phase in ("quiet", "busy"):
        if phase in r:
            s = r[phase][n]
            cells.append(f"{phase} {s['median_ms']:9.3f} / p99 {s['p99_ms']:9.3f} / mean {s['mean_ms']:9.3f} (n={s['runs']})")
    if "busy_p99_over_quiet_median" in r:
        cells.append(f"busy p99 / quiet median {r['busy_p99_over_quiet_median'][n]:5.2f}")
    return "  ".join(cells)


def markdown(results: list[dict], header: dict) -> str:
    phases = [p for p in ("quiet", "busy") if p in results[0]]
    lines = [
        f"\n## {header['date']} — CPU plans beside a busy neighbour ({header['commit']})\n",
        f"Machine: {header['machine']}, {header['cpus']} CPUs. Threads: {header['threads']} asked of every runtime "
        f"(onnxruntime {ort.__version__}); each row says how many it ran with and, for tilefuse, what ran its "
        f"parallel loops (none: no kernel has one). Environment: "
        f"{header['env'] or 'no OpenMP variables'}. Neighbours: {header['neighbours']} busy loop(s), "
        f"{'pinned to CPU ' + str(header['pin']) if header['pin'] is not None else 'unpinned'}. "
        f"Command: `{header['command']}`. Times in ms; 'others': CPU other processes used during the phase, in cores.\n",
    ]
    cols = [f"{p} {k}" for p in phases for k in ("median", "p99", "mean", "runs")]
    extra = ["busy p99 / quiet median"] if len(phases) == 2 else []
    lines += ["| model | runtime | " + " | ".join(cols + extra) + " | others |",
              "| --- | --- | " + " | ".join("---" for _ in cols + extra) + " | --- |"]
    for r in results:
        for n in r["threads"]:
            cells = [f"{r[p][n][k]:.3f}" if k != "runs" else str(r[p][n][k]) for p in phases
                     for k in ("median_ms", "p99_ms", "mean_ms", "runs")]
            cells += [f"{r['busy_p99_over_quiet_median'][n]:.2f}"] if extra else []
            others = "/".join(str(r[p]["other_cores_busy"]) for p in phases)
            pool = f", {r['pool'][n]}" if n in r["pool"] else ""
            lines.append(f"| {r['model']} | {n} ({r['threads'][n]}{pool}) | " + " | ".join(cells) + f" | {others} |")
    return "\n".join(lines) + "\n"


def _specs(items: list[str], ap: argparse.ArgumentParser) -> list[tuple[str, str]]:
    specs = []
    for item in items:
        if item == "tiny":
            specs += [(n, "tiny") for n, s in models.ZOO.items() if s.runs_in_ort and "tiny" in s.configs]
            continue
        name, _, config = item.partition(":")
        if name not in models.ZOO or (config or "tiny") not in models.ZOO[name].configs:
            ap.error(f"{item!r}: expected a zoo NAME:CONFIG (python -m models list) or 'tiny'")
        specs.append((name, config or "tiny"))
    return specs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["bert:tiny", "bert:real"], metavar="NAME:CONFIG")
    ap.add_argument("--threads", type=int, default=2, help="threads for every runtime (default 2)")
    ap.add_argument("--seconds", type=float, default=20.0, help="timed seconds per runtime and phase (default 20)")
    ap.add_argument("--phases", nargs="+", choices=["quiet", "busy"], default=["quiet", "busy"])
    ap.add_argument("--neighbours", type=int, default=1, help="busy processes in the busy phase (default 1)")
    ap.add_argument("--pin", type=int, help="pin the neighbours to this CPU (default: unpinned)")
    ap.add_argument("--save-plans", metavar="DIR", help="save each plan as DIR/NAME-CONFIG.tfplan")
    ap.add_argument("--baseline", metavar="DIR", help="also time DIR/NAME-CONFIG.tfplan where there is one")
    ap.add_argument("--json", metavar="FILE", help="write every figure as JSON")
    ap.add_argument("--out", metavar="FILE.md", help="append the table to this Markdown file")
    args = ap.parse_args()
    specs = _specs(args.models, ap)
    build_models(specs)
    results = []
    for name, config in specs:
        r = bench_model(name, config, args)
        results.append(r)
        for n in r["threads"]:
            print(_line(r, n), flush=True)
        print(f"{'':16s} other processes' CPU, in cores: " + ", ".join(
            f"{p} {r[p]['other_cores_busy']}" for p in ("quiet", "busy") if p in r), flush=True)
    if not results:
        return 0
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    header = {"date": str(datetime.date.today()), "commit": commit, "machine": cpu_name(), "cpus": os.cpu_count(),
              "threads": args.threads, "neighbours": args.neighbours, "pin": args.pin,
              "command": "python benchmarks/cpu_busy_neighbour.py " + " ".join(sys.argv[1:]),
              "env": {k: os.environ[k] for k in OMP_VARS if k in os.environ}}
    if "busy_p99_over_quiet_median" in results[0]:
        worst = max(results, key=lambda r: r["busy_p99_over_quiet_median"]["tilefuse"])
        print(f"worst tilefuse busy p99 / quiet median: {worst['busy_p99_over_quiet_median']['tilefuse']:.2f} "
              f"({worst['model']}; goal: at most 2)")
    if args.json:
        Path(args.json).write_text(json.dumps({"header": header, "results": results}, indent=1))
    if args.out:
        with open(args.out, "a") as f:
            f.write(markdown(results, header))
    return 0



if __name__ == "__main__":
    sys.exit(main())
