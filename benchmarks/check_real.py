"""Real-size zoo models through the CPU pipeline, checked against onnxruntime.

    python benchmarks/check_real.py [--only bert gpt2 resnet]

For each: build (cached), compile cold, compile again warm (kernel cache hit), run the
plan on random inputs and compare every output with onnxruntime (float32: max abs error
<= 1e-4 of the output's scale). Prints one line per model; exits 1 if any check fails.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import onnxruntime as ort  # noqa: E402

import models  # noqa: E402
from tilefuse.compare import compare_output  # noqa: E402
from tilefuse.compiler import compile  # noqa: E402
from tilefuse.runtime import InferenceSession  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="+", default=["bert", "gpt2", "resnet"])
    args = ap.parse_args()
    failed = 0
    for name in args.only:
        path = models.build(name, "real", "float32")
        shapes = models.ZOO[name].shapes("real")
        t0 = time.perf_counter()
        compile(path, "cpu", shapes)
        cold = time.perf_counter() - t0
        t0 = time.perf_counter()
        plan = compile(path, "cpu", shapes)
        warm = time.perf_counter() - t0
        feeds = models.random_inputs(path, shapes, seed=0)
        got = InferenceSession(plan).run(None, feeds)
        ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        want = ref.run(None, feeds)
        checks = [compare_output(o.name, g, w) for o, g, w in zip(ref.get_outputs(), got, want)]
        ok = all(c.ok for c in checks)
        failed += not ok
        errs = ", ".join(f"{c.name} {c.relative_error:.1e}" for c in checks)
        print(f"{name:8s} {shapes} compile cold {cold:.1f} s, warm {warm:.1f} s; rel. error {errs}: {'ok' if ok else 'FAIL'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
