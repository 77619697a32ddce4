"""Two CPU plans of one zoo model, timed in one process, alternating: what a change did.

    python benchmarks/cpu_plan_ab.py save MODEL PLAN_DIR        # compile the real config, save the plan
    git stash; python benchmarks/cpu_plan_ab.py save MODEL old.tfplan; git stash pop
    python benchmarks/cpu_plan_ab.py save MODEL new.tfplan
    python benchmarks/cpu_plan_ab.py run MODEL old.tfplan new.tfplan [--threads 2] [--rounds 15]

This box's speed drifts by up to 2x within an hour (a shared VM), so a change is measured
against the plan before it in the same process, the two called in turn (which one goes
first swaps every round), on the same seeded inputs: the ratio of medians is what the
change did. Never alternate a plan with onnxruntime run by run: onnxruntime's pool
threads spin for about 30 ms after each run and take the cores from the next plan
(benchmarks/NOTES.md, sessions 20 and 25; ``tilefuse.bench.measure_interleaved`` waits
for them between blocks). Prints the largest difference between the two plans' outputs, each plan's median,
and new / old.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

import models  # noqa: E402


def save(name: str, out: str) -> None:
    import tilefuse

    path = models.build(name, "real", "float32")
    tilefuse.compile(str(path), target="cpu", shapes=models.ZOO[name].shapes("real")).save(out)
    print("saved", out)


def run(name: str, old: str, new: str, threads: int, rounds: int) -> None:
    from tilefuse.runtime import InferenceSession

    path = models.build(name, "real", "float32")
    feeds = models.random_inputs(path, models.ZOO[name].shapes("real"), seed=0)
    a, b = InferenceSession(old, threads=threads), InferenceSession(new, threads=threads)
    diff = max(float(np.abs(x - y).max()) for x, y in zip(a.run(None, feeds), b.run(None, feeds)))
    for _ in range(3):
        a.run(None, feeds)
        b.run(None, feeds)
    times: dict[int, list[float]] = {id(a): [], id(b): []}
    for r in range(rounds):
        for s in (a, b) if r % 2 == 0 else (b, a):
            t0 = time.perf_counter()
            s.run(None, feeds)
            times[id(s)].append(time.perf_counter() - t0)
    ta, tb = (1e3 * statistics.median(times[id(s)]) for s in (a, b))
    print(f"{name}, {threads} threads: largest output difference {diff:.3g}; old {ta:.2f} ms, new {tb:.2f} ms, "
          f"new / old {tb / ta:.3f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save")
    s.add_argument("model", choices=[n for n, z in models.ZOO.items() if "real" in z.configs])
    s.add_argument("out")
    r = sub.add_parser("run")
    r.add_argument("model")
    r.add_argument("old")
    r.add_argument("new")
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    if args.cmd == "save":
        save(args.model, args.out)
    else:
        run(args.model, args.old, args.new, args.threads, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
