"""Cold compile time for cuda:sm_90a of every real-size zoo model, on this machine (no GPU).

    python benchmarks/cuda_compile_times.py [--models bert yolo ...] [--dtype float16]
                                            [--keep-caches DIR] [--json FILE]

Each model is compiled by ``tilefuse.compile`` in a fresh Python process whose kernel
cache (``TILEFUSE_CACHE``) is an empty folder, so the time is what a user who runs
``tilefuse optimize MODEL --target cuda:sm_90a`` the first time waits: import,
partitioning, lowering, TileLang's host lowering and nvcc for every kernel, linking. The
models are built (exported) first, untimed. Per model: wall seconds, kernels, cubins
built (distinct kernels), the largest cubin and which kernel it is. ``--keep-caches DIR``
keeps each model's cache under DIR/NAME (``TILEFUSE_CACHE=DIR/NAME`` then reuses it, e.g.
for ``gpu_real_check.py pack``). Exit status 1 if a model fails to compile, takes more
than 180 s, or has a cubin over 512 KB (issue 16's bounds).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

LIMIT_S, CUBIN_LIMIT = 180.0, 512 * 1024
SEQ = 128

_COMPILE = """
import json, sys, tilefuse
plan = tilefuse.compile(sys.argv[1], target="cuda:sm_90a", shapes=json.loads(sys.argv[2]))
print(json.dumps({"kernels": len(plan.kernels)}))
"""


def _shapes(name: str) -> dict:
    import models

    real = models.ZOO[name].shapes("real")
    return {"batch": 1, "seq": SEQ} if "input_ids" in real else {k: list(v) for k, v in real.items()}


def measure(name: str, path: Path, cache: Path) -> dict:
    env = dict(os.environ, TILEFUSE_CACHE=str(cache))
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _COMPILE, str(path), json.dumps(_shapes(name))],
                          env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    row: dict = {"model": name, "seconds": round(seconds, 1)}
    if done.returncode:
        row["error"] = (done.stderr.strip().splitlines() or ["(no output)"])[-1][:400]
        return row
    row["kernels"] = json.loads(done.stdout.strip().splitlines()[-1])["kernels"]
    cubins = sorted(cache.rglob("*.cubin"), key=lambda p: p.stat().st_size)
    row["cubins"] = len(cubins)
    if cubins:
        row["largest_cubin_kb"] = round(cubins[-1].stat().st_size / 1024, 1)
        row["largest_kernel"] = cubins[-1].stem.rsplit("-", 1)[0]
    return row


def main() -> int:
    import models

    real = [n for n, s in models.ZOO.items() if "real" in s.configs]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=real, choices=real)
    ap.add_argument("--dtype", default="float16", choices=models.DTYPES, help="the models' dtype")
    ap.add_argument("--keep-caches", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    paths = {}
    for name in args.models:  # exports first, untimed
        paths[name] = models.build(name, "real", args.dtype)
    rows, failed = [], False
    for name in args.models:
        cache = Path(tempfile.mkdtemp(prefix=f"tf-cold-{name}-"))
        row = measure(name, paths[name], cache)
        row["dtype"] = args.dtype
        if args.keep_caches:
            dest = args.keep_caches / name
            shutil.rmtree(dest, ignore_errors=True)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(cache), dest)
        else:
            shutil.rmtree(cache, ignore_errors=True)
        over = "error" in row or row["seconds"] > LIMIT_S or row.get("largest_cubin_kb", 0) * 1024 > CUBIN_LIMIT
        failed |= over
        rows.append(row)
        print(f"{name:18s} {row['seconds']:7.1f} s  {row.get('kernels', '-'):>4} kernels  {row.get('cubins', '-'):>4} cubins  "
              f"largest {row.get('largest_cubin_kb', '-')} KB ({row.get('largest_kernel', '')})"
              f"{'  ' + row['error'] if 'error' in row else ''}{'  OVER' if over else ''}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"machine": f"{platform.node()} ({os.cpu_count()} cores)", "rows": rows}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
