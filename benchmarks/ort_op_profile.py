"""Where onnxruntime's time goes on a model, node by node: the peer's side of
``tilefuse profile``.

    python benchmarks/ort_op_profile.py MODEL.onnx [--shape NAME=D0,D1,...] [--threads N] [--runs N] [--top N]

onnxruntime's own profiler (``SessionOptions.enable_profiling``; spinning off, so a
kernel's time is its own) over ``--runs`` runs after warm-up on random inputs; each
node's kernel time is its median over the runs. Prints the time by op type and the
``--top`` nodes, in microseconds (``--json FILE``: every node's), with the median of plain runs (no profiler) to compare
with the sum. Used to put a tilefuse kernel beside the onnxruntime nodes it replaces.
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _feeds(sess, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for i in sess.get_inputs():
        shape = shapes.get(i.name) or tuple(d if isinstance(d, int) else 1 for d in i.shape)
        if "int" in i.type:
            feeds[i.name] = rng.integers(0, 100, shape).astype(np.int64 if "64" in i.type else np.int32)
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float16 if "16" in i.type else np.float32)
    return feeds


def main() -> int:
    import onnxruntime as ort

    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--shape", action="append", default=[], metavar="NAME=D0,D1,...")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", metavar="FILE", help="also write each node's median time (us) and op type")
    args = ap.parse_args()
    shapes = {k: tuple(int(d) for d in v.split(",")) for k, v in (s.split("=", 1) for s in args.shape)}
    with tempfile.TemporaryDirectory() as tmp:
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        plain = ort.InferenceSession(args.model, so, providers=["CPUExecutionProvider"])
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(tmp) / "ort")
        sess = ort.InferenceSession(args.model, so, providers=["CPUExecutionProvider"])
        feeds = _feeds(sess, shapes)
        for _ in range(5):
            sess.run(None, feeds)
            plain.run(None, feeds)
        walls = []
        for _ in range(args.runs):
            sess.run(None, feeds)
            t0 = time.perf_counter()
            plain.run(None, feeds)
            walls.append((time.perf_counter() - t0) * 1e6)
        events = json.loads(Path(sess.end_profiling()).read_text())
    per_node: dict[str, list[float]] = collections.defaultdict(list)
    op_of = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            node = e["name"].removesuffix("_kernel_time")
            per_node[node].append(float(e["dur"]))
            op_of[node] = e.get("args", {}).get("op_name", "?")
    runs = 5 + args.runs  # warm-up runs are profiled too: keep the last ``runs``
    med = {n: statistics.median(v[-args.runs:]) for n, v in per_node.items() if len(v) >= runs}
    by_op: dict[str, float] = collections.defaultdict(float)
    for n, t in med.items():
        by_op[op_of[n]] += t
    total = sum(med.values())
    print(f"onnxruntime {ort.__version__}, {args.threads} thread(s): node times sum to {total:.1f} us; "
          f"plain runs median {statistics.median(walls):.1f} us")
    for op, t in sorted(by_op.items(), key=lambda kv: -kv[1]):
        print(f"  {op:28s} {t:10.1f} us  {100 * t / total:5.1f}%")
    print(f"top {args.top} nodes:")
    for n, t in sorted(med.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  {t:10.1f} us  {op_of[n]:20s} {n}")
    if args.json:
        Path(args.json).write_text(json.dumps({n: {"op": op_of[n], "us": t} for n, t in med.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
