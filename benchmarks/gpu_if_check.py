"""CUDA plans with ONNX If (run-time branches and --const specialisations), built here and
checked on a GPU machine against onnxruntime.

    python benchmarks/gpu_if_check.py build            # any machine with nvcc + tilelang
    PYTHONPATH=. python benchmarks/gpu_if_check.py run # the GPU machine (numpy, cuda-bindings)

``build`` compiles each case for cuda:sm_90a into build/gpu_if/NAME.tfplan and saves beside
it (NAME.npz) random inputs for each condition value and onnxruntime's outputs for them,
so the GPU machine needs neither tilelang nor the test models. ``run`` runs every plan on
every input set (a branch is taken one way, then the other, then the first again: the
arena is reused between them), compares with onnxruntime's outputs (tilefuse.compare's
tolerances, 1e-2 for fp16 plans), and writes results.json (to --out, default $OUT or
build/gpu_if). Exit status 1 if a case fails to build or to match.

The conditions are one-element tensors, not 0-d scalars: the CUDA code generator cannot
yet write a 0-d buffer (see the report of the If work).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent / "build" / "gpu_if"


def cases():
    """name -> (model, consts, precision, input sets)."""
    from tests.compiler.if_models import nested_switch_model, sample_rate_model, sum_switch_model

    rng = np.random.default_rng(0)
    x4 = lambda offset: {"x": (rng.standard_normal((2, 3, 8, 8)) + offset).astype(np.float32)}  # noqa: E731
    x2 = lambda offset: {"x": (rng.standard_normal((4, 8)) * 0.5 + offset).astype(np.float32)}  # noqa: E731
    audio = lambda rate: {"audio": rng.standard_normal((1, 16, 32)).astype(np.float32),  # noqa: E731
                          "sample_rate": np.array([rate], np.int64)}
    return {
        "sum-switch": (sum_switch_model(keepdims=1), None, "fp32", [x4(-1), x4(1), x4(-1)]),
        "sum-switch-fp16": (sum_switch_model(keepdims=1), None, "fp16", [x4(1), x4(-1)]),
        "nested-switch": (nested_switch_model(keepdims=1), None, "fp32", [x2(-1), x2(0.3), x2(3), x2(0.3)]),
        "sample-rate": (sample_rate_model(rate_shape=(1,)), None, "fp32", [audio(16000), audio(8000), audio(16000)]),
        "sample-rate-const-16k": (sample_rate_model(rate_shape=(1,)), {"sample_rate": 16000}, "fp32", [audio(16000)]),
        "sample-rate-reshape-const-44k": (sample_rate_model((1, 32, 16), rate_shape=(1,)), {"sample_rate": 44100},
                                          "fp32", [audio(44100)]),
    }


def build(args) -> int:
    import onnxruntime as ort

    from tilefuse.compiler import compile

    ROOT.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name, (model, consts, precision, feeds_list) in cases().items():
        try:
            plan = compile(model, "cuda:sm_90a", None, precision=precision, consts=consts)
            plan.save(ROOT / f"{name}.tfplan")
            ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            arrays = {}
            for k, feeds in enumerate(feeds_list):
                for n, a in feeds.items():
                    if n not in (consts or {}):
                        arrays[f"in{k}/{n}"] = a
                arrays[f"out{k}"] = ref.run(None, feeds)[0]
            np.savez(ROOT / f"{name}.npz", **arrays)
            print(f"{name:32s} built: {plan}", flush=True)
        except Exception as e:  # report every case, then fail
            failed += 1
            print(f"{name:32s} FAILED to build: {type(e).__name__}: {str(e)[:2000]}", flush=True)
    return 1 if failed else 0


def run(args) -> int:
    from tilefuse.compare import compare_output
    from tilefuse.runtime import InferenceSession

    out_dir = Path(args.out or os.environ.get("OUT") or ROOT)
    out_dir.mkdir(parents=True, exist_ok=True)
    results, failed = [], 0
    for plan_dir in sorted(ROOT.glob("*.tfplan")):
        name = plan_dir.name.removesuffix(".tfplan")
        record = {"case": name, "runs": []}
        try:
            sess = InferenceSession(plan_dir)
            data = np.load(ROOT / f"{name}.npz")
            k = 0
            while f"out{k}" in data:
                feeds = {key.split("/", 1)[1]: data[key] for key in data.files if key.startswith(f"in{k}/")}
                (got,) = sess.run(None, feeds)
                tol = 1e-2 if "fp16" in name else None
                c = compare_output("y", got, data[f"out{k}"], tolerance=tol)
                record["runs"].append({"ok": bool(c.ok), "max_abs_error": float(c.max_abs_error),
                                       "problem": c.problem})
                k += 1
            record["ok"] = all(r["ok"] for r in record["runs"]) and k > 0
        except Exception as e:  # report every case, then fail
            record.update(ok=False, error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc())
        failed += not record["ok"]
        print(f"{name:32s} {'ok' if record['ok'] else 'FAILED'} {record.get('error', '')} "
              f"{[round(r['max_abs_error'], 7) for r in record['runs']]}", flush=True)
        results.append(record)
    (out_dir / "results.json").write_text(json.dumps(results, indent=1))
    print(f"{len(results) - failed}/{len(results)} cases match onnxruntime")
    return 1 if failed or not results else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build")
    r = sub.add_parser("run")
    r.add_argument("--out", help="where results.json goes (default $OUT or build/gpu_if)")
    args = p.parse_args()
    return build(args) if args.cmd == "build" else run(args)


if __name__ == "__main__":
    sys.exit(main())
