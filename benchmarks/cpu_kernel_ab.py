"""Each kernel of one CPU plan against its counterpart in another, alone and interleaved.

    python benchmarks/cpu_plan_ab.py save MODEL old.tfplan     # (git stash; ...; git stash pop)
    python benchmarks/cpu_plan_ab.py save MODEL new.tfplan
    python benchmarks/cpu_kernel_ab.py old.tfplan new.tfplan [--threads 1] [--rounds 6] [--calls 8] [--hot] [--all]

A whole-plan A/B (cpu_plan_ab.py) says what a change did to a model; this says which
kernels did it. Kernels are paired by their parameters' roles and shapes (a kernel whose
operands a change re-laid out has no counterpart and is skipped); each pair is loaded from
the plans' own libraries, fed seeded random inputs, and called in turn, ``--calls`` calls
each in ``--rounds`` rounds (which goes first swaps every round). Before each call a 64 MB
buffer is written, so the kernel starts with cold caches as it would after the model's
other kernels (``--hot``: not). Prints each pair's median time in microseconds and new /
old, the pairs whose code differs (``--all``: every pair), and the sums.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def _kernels(plan: Path) -> dict[str, dict]:
    """The plan's kernels in step order, by name (each once)."""
    manifest = json.loads((plan / "manifest.json").read_text())
    by_name = {k["name"]: k for k in manifest["kernels"]}
    out: dict[str, dict] = {}
    for step in manifest["steps"]:
        if step.get("op") == "kernel" and step["kernel"] in by_name:
            out.setdefault(step["kernel"], by_name[step["kernel"]])
    return out


def _signature(kernel: dict) -> tuple:
    return tuple((p["role"], tuple(p["shape"]), p["dtype"]) for p in kernel["params"])


class _Loaded:
    """A kernel's function from its plan's library, with arguments it may run on."""

    def __init__(self, plan: Path, kernel: dict, threads: int) -> None:
        self.lib = ctypes.CDLL(str((plan / kernel["file"]).resolve()))
        self.fn = getattr(self.lib, kernel["symbol"])
        rng = np.random.default_rng(0)
        self.arrays = []
        for p in kernel["params"]:
            dtype = np.dtype(p["dtype"])
            self.arrays.append(rng.standard_normal(p["shape"]).astype(dtype) if dtype.kind == "f"
                               else np.zeros(p["shape"], dtype))  # (integer inputs: index 0 is always in range)
        self.status = np.zeros(64, np.int64)  # a status word, for kernels that check indices
        self.args = (ctypes.c_void_p * (len(self.arrays) + 1))(*[a.ctypes.data for a in self.arrays],
                                                              self.status.ctypes.data)
        if hasattr(self.lib, "tf_threads_set"):
            self.lib.tf_threads_set(threads)

    def __call__(self) -> None:
        self.fn(self.args)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--hot", action="store_true", help="do not evict the caches before each call")
    ap.add_argument("--all", action="store_true", help="also print pairs whose code is the same")
    args = ap.parse_args()
    old, new = Path(args.old), Path(args.new)
    theirs: dict[tuple, dict] = {}
    for k in _kernels(new).values():
        theirs.setdefault(_signature(k), k)
    flush = np.ones(16 << 20, np.float32)
    total_old = total_new = 0.0
    print(f"{'old kernel':24s} {'new kernel':24s} {'old us':>9s} {'new us':>9s}  new/old  ({args.threads} thread(s), "
          f"{'hot' if args.hot else 'cold'} caches)")
    for name, k in _kernels(old).items():
        other = theirs.get(_signature(k))
        if other is None:
            print(f"{name:24s} {'(no counterpart)':24s}")
            continue
        a, b = _Loaded(old, k, args.threads), _Loaded(new, other, args.threads)
        times: dict[int, list[float]] = {id(a): [], id(b): []}
        for r in range(args.rounds):
            for f in (a, b) if r % 2 == 0 else (b, a):
                for _ in range(args.calls):
                    if not args.hot:
                        flush[::16] += 1.0
                    t0 = time.perf_counter()
                    f()
                    times[id(f)].append(time.perf_counter() - t0)
        ta, tb = (1e6 * statistics.median(times[id(f)]) for f in (a, b))
        total_old, total_new = total_old + ta, total_new + tb
        if args.all or name != other["name"]:
            print(f"{name:24s} {other['name']:24s} {ta:9.1f} {tb:9.1f}  {tb / ta:.3f}", flush=True)
    print(f"{'each kernel once':49s} {total_old:9.1f} {total_new:9.1f}  {total_new / max(total_old, 1e-9):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
