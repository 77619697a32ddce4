"""The CUDA execution provider inside onnxruntime, on the GPU machine.

    PYTHONPATH=. python tests/ort/gpu_ep_check.py build    # here: nvcc, tilelang, a C compiler
    PYTHONPATH=. python tests/ort/gpu_ep_check.py run      # there: numpy and onnxruntime only

``build`` exports tiny zoo models (bert, gpt2, llama, vit, mlp; float32 and float16) for
``cuda:sm_90a`` with ``export_ort`` (EPContext nodes for TilefuseCudaExecutionProvider,
cubins beside them), builds the provider library, and saves fresh random inputs with
plain onnxruntime's outputs on the original model (CPU), all under build/ort_gpu_ep/
(carry that folder to the GPU machine).

``run`` registers the carried library with the onnxruntime installed there (a CPU-only
build is enough: the provider brings its own device memory, allocator and copies), runs
every export in a session with the provider on the GPU, and compares with the saved
reference: max abs error within 1e-3 (float32) or 1e-2 (float16) times the output's
scale. It prints the hardware devices onnxruntime offers, a line per model and a
summary, writes the results as JSON to $OUT/ort_gpu_ep.json (else into the folder), and
exits 1 if a model fails. It imports no compiler, tilelang or torch.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO))
ROOT = REPO / "build" / "ort_gpu_ep"
LIBRARY = "libtilefuse_ep.so"
MODELS = ["bert", "gpt2", "llama", "vit", "mlp"]
DTYPES = ["float32", "float16"]
TOLERANCE = {"float32": 1e-3, "float16": 1e-2}  # relative to the output's scale (tilefuse.compare)
MAX_BYTES = 40 << 20


def build(args) -> int:
    import onnxruntime as ort

    import models
    from tilefuse.ort import export_ort, get_library_path

    root = Path(args.root)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    shutil.copyfile(get_library_path(), root / LIBRARY)
    failed = 0
    for name in args.models:
        for dtype in args.dtypes:
            tag = f"{name}-{dtype}"
            t0 = time.perf_counter()
            try:
                shapes = models.ZOO[name].shapes("tiny")
                path = models.build(name, "tiny", dtype)
                result = export_ort(path, root / tag, "cuda:sm_90a", shapes, "ep")
                save_reference(path, shapes, root / f"{tag}.npz", ort)
                print(f"{tag:18s} exported: {result.kernel_nodes} kernel nodes for {result.claimed_nodes} ONNX nodes, "
                      f"{len(result.kept)} kept by onnxruntime, {time.perf_counter() - t0:.1f} s", flush=True)
            except Exception as e:  # report every model, then fail
                failed += 1
                print(f"{tag:18s} FAILED: {type(e).__name__}: {str(e)[:1500]}", flush=True)
    size = sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    (root / "manifest.json").write_text(json.dumps({"commit": commit, "built": time.strftime("%Y-%m-%d %H:%M:%S"),
                                                    "onnxruntime": ort.__version__, "bytes": size}, indent=1))
    print(f"{root}: {size / 2**20:.1f} MiB")
    if size > MAX_BYTES:
        print(f"more than {MAX_BYTES >> 20} MiB to carry")
        return 1
    return 1 if failed else 0


def save_reference(path: Path, shapes, out: Path, ort) -> None:
    """Fresh random inputs and plain onnxruntime's outputs (CPU, the original model)."""
    import models

    feeds = models.random_inputs(path, shapes, seed=random.randrange(2**31))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    np.savez(out, **{f"in:{k}": v for k, v in feeds.items()},
             **{f"out:{k}": v for k, v in zip(names, sess.run(names, feeds))})


def run_one(ort, folder: Path, library: Path, repeats: int) -> dict:
    from tilefuse.compare import compare_output
    from tilefuse.ort import session_options

    data = np.load(folder.parent / f"{folder.name}.npz")
    feeds = {k[3:]: data[k] for k in data.files if k.startswith("in:")}
    expected = {k[4:]: data[k] for k in data.files if k.startswith("out:")}
    t0 = time.perf_counter()
    sess = ort.InferenceSession(str(folder / "model.onnx"), session_options(target="cuda", library=library))
    created = time.perf_counter() - t0
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    tol = TOLERANCE[folder.name.rsplit("-", 1)[1]]
    checks = [compare_output(n, got[n], w, tol) for n, w in expected.items()]
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t)
    return {"ok": all(c.ok for c in checks), "session_s": round(created, 3),
            "run_ms": round(1e3 * sorted(times)[len(times) // 2], 3) if times else None,
            "outputs": [{"name": c.name, "max_abs_error": c.max_abs_error, "scale": c.scale,
                         "relative_error": c.relative_error, "problem": c.problem} for c in checks]}


def run(args) -> int:
    import onnxruntime as ort

    from tilefuse.ort import CUDA_EP_NAME, hardware_devices, register

    root = Path(args.root)
    library = root / LIBRARY
    report: dict = {"onnxruntime": ort.__version__, "providers": ort.get_available_providers(), "models": {}}
    print(f"onnxruntime {ort.__version__}, providers {report['providers']}")
    try:
        register(library=library)
        report["hardware_devices"] = hardware_devices()
        report["ep_devices"] = [f"{d.ep_name} on {d.device.type.name} vendor 0x{d.device.vendor_id:04x}"
                                for d in ort.get_ep_devices()]
    except Exception as e:
        report["error"] = f"registering {library}: {type(e).__name__}: {e}"
    for line in report.get("hardware_devices", []):
        print(f"  onnxruntime offers: {line}")
    for line in report.get("ep_devices", []):
        print(f"  provider device: {line}")
    if not any(CUDA_EP_NAME in d for d in report.get("ep_devices", [])):
        print(f"  no device for {CUDA_EP_NAME}")
    folders = sorted(p for p in root.iterdir() if p.is_dir() and (p / "model.onnx").is_file())
    failed = 0
    for folder in folders:
        try:
            result = run_one(ort, folder, library, args.repeats)
            detail = " ".join(f"{o['name']}:{o['relative_error']:.1e}" + (f" ({o['problem']})" if o["problem"] else "")
                              for o in result["outputs"])
            detail += f"  run {result['run_ms']} ms" if result["run_ms"] is not None else ""
        except Exception as e:
            result = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}
            detail = result["error"][:800]
        report["models"][folder.name] = result
        failed += not result["ok"]
        print(f"{folder.name:18s} {'ok' if result['ok'] else 'FAILED':7s} {detail}", flush=True)
    summary = f"{len(folders) - failed}/{len(folders)} exports match onnxruntime (CPU) through {CUDA_EP_NAME}"
    report["summary"] = summary
    print(summary)
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else root
    out.mkdir(parents=True, exist_ok=True)
    (out / "ort_gpu_ep.json").write_text(json.dumps(report, indent=1))
    return 1 if failed or not folders or "error" in report else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="export the models and save references (here)")
    b.add_argument("--models", nargs="+", default=MODELS)
    b.add_argument("--dtypes", nargs="+", default=DTYPES)
    b.add_argument("--root", default=str(ROOT))
    r = sub.add_parser("run", help="run them in onnxruntime with the CUDA provider (on the GPU machine)")
    r.add_argument("--root", default=str(ROOT))
    r.add_argument("--repeats", type=int, default=10, help="timed runs per model after the checked one")
    args = ap.parse_args()
    return build(args) if args.cmd == "build" else run(args)


if __name__ == "__main__":
    sys.exit(main())
