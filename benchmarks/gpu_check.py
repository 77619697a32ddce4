"""CUDA plans of the tiny zoo, built here and checked on a GPU machine.

    python benchmarks/gpu_check.py build [--models ...] [--dtypes float32 float16]   # any machine with nvcc + tilelang
    python benchmarks/gpu_check.py build --onnx FILE.onnx ... [--precision fp16]     # models of your own (static shapes)
    PYTHONPATH=. python benchmarks/gpu_check.py run [--out DIR]                       # the GPU machine

``build`` compiles each model for cuda:sm_90a into build/gpu/NAME-DTYPE.tfplan and saves,
beside it, fresh random inputs and onnxruntime's outputs for them (NAME-DTYPE.npz), so the
GPU machine needs neither the zoo nor tilelang: only numpy, cuda-bindings and this repo.
``run`` loads every plan with tilefuse.InferenceSession, compares each output with
onnxruntime's (the tolerances of tilefuse.compare, per dtype), times the plan's launches
with CUDA events, and writes results.json (to --out, default $OUT or build/gpu).
Exit status 1 if any model fails to build (build) or to match (run).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent / "build" / "gpu"
TF32_TOLERANCE = 1e-3  # issue 5: fp32/tf32 plans within 1e-3 of the output's scale


def build(args) -> int:
    import models
    from models.reference import save_reference
    from tilefuse.compare import TOLERANCE
    from tilefuse.compiler import compile

    ROOT.mkdir(parents=True, exist_ok=True)
    if args.onnx:  # the models given, at the shapes they declare
        jobs = [(Path(f).stem, Path(f), {}) for f in args.onnx]
    else:
        names = args.models or [n for n, s in models.ZOO.items() if s.runs_in_ort]
        jobs = [(f"{n}-{d}", None, {"name": n, "dtype": d}) for n in names for d in args.dtypes]
    failed = 0
    for base, given, zoo in jobs:
        tag = base + (f"-as-{args.precision}" if args.precision != "fp32" else "")
        t0 = time.perf_counter()
        try:
            shapes = models.ZOO[zoo["name"]].shapes("tiny") if zoo else {}
            path = given or models.build(zoo["name"], "tiny", zoo["dtype"])
            plan = compile(path, "cuda:sm_90a", shapes, precision=args.precision)
            plan.save(ROOT / f"{tag}.tfplan")
            tol = {"fp16": TOLERANCE["float16"], "bf16": TOLERANCE["bfloat16"], "tf32": TF32_TOLERANCE}.get(args.precision)
            save_reference(path, shapes, ROOT / f"{tag}.npz", **({"tolerance": np.float64(tol)} if tol else {}))
            print(f"{tag:32s} built: {len(plan.kernels)} kernels, {len(plan.steps)} steps, "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)
        except Exception as e:  # report every model, then fail
            failed += 1
            print(f"{tag:32s} FAILED to build: {type(e).__name__}: {str(e)[:2000]}", flush=True)
    return 1 if failed else 0


def run(args) -> int:
    from models.reference import load_reference
    from tilefuse.compare import compare_output
    from tilefuse.runtime import InferenceSession

    out_dir = Path(args.out or os.environ.get("OUT") or ROOT)
    out_dir.mkdir(parents=True, exist_ok=True)
    results, failed = [], 0
    for plan_dir in sorted(ROOT.glob("*.tfplan")):
        tag = plan_dir.name.removesuffix(".tfplan")
        row: dict = {"model": tag}
        try:
            data = np.load(ROOT / f"{tag}.npz")
            feeds, expected = load_reference(data)
            sess = InferenceSession(plan_dir)
            names = list(expected)
            got = sess.run(names, feeds)
            tol = float(data["tolerance"]) if "tolerance" in data.files else None  # a --precision build
            checks = [compare_output(n, g, expected[n], tolerance=tol) for n, g in zip(names, got)]
            row["outputs"] = {c.name: {"ok": c.ok, "max_abs_err": c.max_abs_error, "problem": c.problem} for c in checks}
            row["ok"] = all(c.ok for c in checks)
            executor = sess._executor
            executor.timed(5)  # warm-up
            times = executor.timed(args.repeats)
            row["ms_median"] = statistics.median(times)
            row["ms_min"] = min(times)
            row["cuda_graph"] = executor._graph is not None
            row["ms_median_launches"] = statistics.median(executor.timed(args.repeats, graph=False))
        except Exception as e:
            row["ok"] = False
            row["error"] = f"{type(e).__name__}: {e}"
            row["trace"] = traceback.format_exc()[-3000:]
        failed += not row["ok"]
        results.append(row)
        status = "ok" if row["ok"] else "MISMATCH" if "outputs" in row else "ERROR"
        detail = row.get("error", "") or " ".join(f"{k}:{v['max_abs_err']:.2e}" for k, v in row["outputs"].items())
        print(f"{tag:32s} {status:8s} {row.get('ms_median', float('nan')):8.3f} ms "
              f"({row.get('ms_median_launches', float('nan')):.3f} step by step)  {detail[:300]}", flush=True)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1, default=str))
    print(f"{len(results) - failed}/{len(results)} plans match onnxruntime")
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--models", nargs="+")
    b.add_argument("--onnx", nargs="+", metavar="FILE", help="ONNX files with static shapes, instead of the zoo")
    b.add_argument("--dtypes", nargs="+", default=["float32"])
    b.add_argument("--precision", default="fp32", help="compile float32 models with --precision (fp16, bf16, tf32)")
    r = sub.add_parser("run")
    r.add_argument("--out")
    r.add_argument("--repeats", type=int, default=50)
    args = ap.parse_args()
    return build(args) if args.cmd == "build" else run(args)


if __name__ == "__main__":
    sys.exit(main())
