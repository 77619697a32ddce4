"""Out-of-range indices on the GPU: CUDA plans built here, checked on the GPU machine.

    python tools/gpu_index_check.py build [--root DIR]              # here: nvcc, tilelang, a C compiler
    PYTHONPATH=. python tools/gpu_index_check.py run [--root DIR]   # there: numpy, onnx, onnxruntime, cuda-bindings

``build`` compiles for cuda:sm_90a, into DIR (default build/gpu_index): the bundled tiny
BERT (examples/bert-tiny.onnx, vocabulary 100, batch 2, seq 16) as a plan, as an export
for the plugin execution provider (with the provider library) and as one for the
custom-op library (FusedKernelCuda nodes), and one plan per
index-consuming op of tests/compiler/index_cases.py (Gather with int64 and int32
indices, GatherElements, GatherND, ScatterElements plain and with add, ScatterND, and
OneHot), each beside its ONNX model.

``run`` checks each on the GPU against onnxruntime on the CPU:

- input_ids of 100, 1000, -101, INT64_MIN, 2**40 and 100000 fail the run with an
  ExecutionError naming input_ids, the Gather node and the value (the kernel's status
  word, copied back after the graph replay), and a run right after, with valid ids
  (negative ones among them), matches onnxruntime; the same through
  TilefuseCudaExecutionProvider inside onnxruntime (INVALID_ARGUMENT, the same message),
  and through the custom-op library's CUDA path, driven by tests/ort/gpu_harness.py (the
  GPU machine's onnxruntime has no CUDA provider; the node's status carries the message);
- every op with indices in range, and with negative ones, matches onnxruntime; with one
  out of range it fails with its message, and the next valid run matches;
- OneHot's out-of-range indices give rows of the off value, as onnxruntime's do;
- the bert plan's median time (CUDA graph replay with the status read-back) is printed,
  for comparison with gpu_check.py's figure for the same model.

It prints a line per check, writes gpu_index_check.json to $OUT (else DIR), and exits 1
if any check fails. It imports no compiler, tilelang or torch. ``build --target cpu``
makes the same checks for the CPU (plans and the CPU provider), to try the script where
there is no GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.compiler.index_cases import (  # noqa: E402
    BAD_IDS,
    BERT_SHAPES,
    CASES,
    EXAMPLE,
    bert_feeds,
    bert_message,
    one_hot_feeds,
    one_hot_model,
)

ROOT = REPO / "build" / "gpu_index"
LIBRARY = "libtilefuse_ep.so"


def build(args) -> int:
    from tilefuse.compiler import compile
    from tilefuse.ort import export_ort, get_library_path

    root = Path(args.root)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    (root / "target.json").write_text(json.dumps({"target": args.target}))
    t0 = time.perf_counter()
    compile(EXAMPLE, args.target, BERT_SHAPES).save(root / "bert.tfplan")
    export_ort(EXAMPLE, root / "bert-ep", args.target, BERT_SHAPES, "ep")
    export_ort(EXAMPLE, root / "bert-ops", args.target, BERT_SHAPES, "custom-ops")
    shutil.copyfile(get_library_path(), root / LIBRARY)
    print(f"bert: plan and provider export, {time.perf_counter() - t0:.1f} s", flush=True)
    for name, model in [(c.name, c.model) for c in CASES] + [("one_hot", one_hot_model())]:
        t0 = time.perf_counter()
        (root / f"{name}.onnx").write_bytes(model)
        compile(model, args.target).save(root / f"{name}.tfplan")
        print(f"{name}: plan, {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


class Checks:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def record(self, what: str, ok: bool, detail: str = "") -> None:
        self.rows.append({"check": what, "ok": bool(ok), "detail": detail})
        print(f"{'ok' if ok else 'FAILED':7s} {what}  {detail[:400]}", flush=True)

    def matches(self, what: str, got, model: bytes | Path, feeds: dict) -> None:
        import onnxruntime as ort

        from tilefuse.compare import compare_output

        sess = ort.InferenceSession(_readable(model), providers=["CPUExecutionProvider"])
        want = sess.run(None, feeds)
        checks = [compare_output(o.name, np.asarray(g), w) for o, g, w in zip(sess.get_outputs(), got, want)]
        self.record(what, all(c.ok for c in checks),
                    " ".join(f"{c.name}:{c.max_abs_error:.1e}" + (f" ({c.problem})" if c.problem else "") for c in checks))

    def fails(self, what: str, run, message: str, error_type: type | None = None) -> None:
        try:
            run()
        except Exception as e:  # noqa: BLE001 - the check says which error came
            text = str(e)
            ok = (error_type is None or isinstance(e, error_type)) and (text == message or text.endswith(f": {message}"))
            self.record(what, ok, f"{type(e).__name__}: {text}")
            return
        self.record(what, False, "no error")


def _with(feeds: dict, name: str, value: int, rng) -> dict:
    out = {k: v.copy() for k, v in feeds.items()}
    flat = out[name].reshape(-1)
    flat[rng.integers(flat.size)] = value
    return out


def check_bert(root: Path, checks: Checks, rng) -> None:
    from tilefuse.errors import ExecutionError
    from tilefuse.runtime import InferenceSession

    sess = InferenceSession(root / "bert.tfplan")
    for bad in BAD_IDS:
        checks.fails(f"bert plan, input_ids holding {bad}", lambda: sess.run(None, _with(bert_feeds(rng), "input_ids", bad, rng)),
                     bert_message(bad), ExecutionError)
        valid = bert_feeds(rng, low=-100)
        checks.matches(f"bert plan, valid ids after {bad}", sess.run(None, valid), EXAMPLE, valid)
    feeds = bert_feeds(rng)
    sess.run(None, feeds)
    times = []
    for _ in range(200):
        t = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - t)
    checks.record("bert plan, host latency per run (numpy in and out, status read back)", True,
                  f"median {1e3 * statistics.median(times):.3f} ms over 200 runs")


def check_bert_ep(root: Path, checks: Checks, rng) -> None:
    import onnxruntime as ort

    from tilefuse.ort import CUDA_EP_NAME, EP_NAME, register, session_options

    library = root / LIBRARY
    register(library=library)
    cuda = json.loads((root / "target.json").read_text())["target"].startswith("cuda")
    options = session_options(target="cuda" if cuda else "cpu", library=library)
    sess = ort.InferenceSession(str(root / "bert-ep" / "model.onnx"), options)
    for bad in BAD_IDS:
        checks.fails(f"bert in onnxruntime ({CUDA_EP_NAME if cuda else EP_NAME}), input_ids holding {bad}",
                     lambda: sess.run(None, _with(bert_feeds(rng), "input_ids", bad, rng)), bert_message(bad))
        valid = bert_feeds(rng, low=-100)
        checks.matches(f"bert in onnxruntime, valid ids after {bad}", sess.run(None, valid), EXAMPLE, valid)


def check_bert_custom_ops(root: Path, checks: Checks, rng) -> None:
    folder = root / "bert-ops"
    if json.loads((root / "target.json").read_text())["target"].startswith("cuda"):
        from cuda.bindings import driver as cu

        from tests.ort.gpu_harness import check, run_export

        check(cu, cu.cuInit(0))
        check(cu, cu.cuCtxSetCurrent(check(cu, cu.cuDevicePrimaryCtxRetain(check(cu, cu.cuDeviceGet(0))))))
        stream = check(cu, cu.cuStreamCreate(1))  # non-blocking, like onnxruntime's compute stream

        def run(feeds):
            got = run_export(cu, stream, folder, feeds)
            return [got[name] for name in ("last_hidden_state", "pooler_output")]
        where = "custom-op library (FusedKernelCuda through tests/ort/gpu_harness.py)"
    else:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.register_custom_ops_library(str(folder / "libtilefuse_ops.so"))
        sess = ort.InferenceSession(str(folder / "model.onnx"), so)
        run = lambda feeds: sess.run(None, feeds)  # noqa: E731
        where = "custom-op library (FusedKernel in onnxruntime)"
    for bad in BAD_IDS:
        checks.fails(f"bert, {where}, input_ids holding {bad}", lambda: run(_with(bert_feeds(rng), "input_ids", bad, rng)),
                     bert_message(bad))
        valid = bert_feeds(rng, low=-100)
        checks.matches(f"bert, {where}, valid ids after {bad}", run(valid), EXAMPLE, valid)


def check_ops(root: Path, checks: Checks, rng) -> None:
    from tilefuse.errors import ExecutionError
    from tilefuse.runtime import InferenceSession

    for case in CASES:
        sess = InferenceSession(root / f"{case.name}.tfplan")
        for kind in ("valid", "negative"):
            feeds, _ = case.feeds(rng, kind)
            checks.matches(f"{case.name}, {kind} indices", sess.run(None, feeds), case.model, feeds)
        feeds, bad = case.feeds(rng, "bad")
        checks.fails(f"{case.name}, an index of {bad}", lambda: sess.run(None, feeds), case.message(bad), ExecutionError)
        feeds, _ = case.feeds(rng, "negative")
        checks.matches(f"{case.name}, valid indices after the error", sess.run(None, feeds), case.model, feeds)
    sess = InferenceSession(root / "one_hot.tfplan")
    feeds = one_hot_feeds(rng)
    checks.matches("one_hot, out-of-range indices give rows of the off value", sess.run(None, feeds), one_hot_model(), feeds)


def run(args) -> int:
    root = Path(args.root)
    rng = np.random.default_rng(args.seed)
    checks = Checks()
    for part in (check_bert, check_bert_ep, check_bert_custom_ops, check_ops):
        try:
            part(root, checks, rng)
        except Exception as e:  # noqa: BLE001 - report it and go on with the next part
            checks.record(f"{part.__name__} stopped", False, f"{type(e).__name__}: {e}\n{traceback.format_exc()[-2000:]}")
    failed = sum(not r["ok"] for r in checks.rows)
    target = json.loads((root / "target.json").read_text())["target"]
    summary = f"{len(checks.rows) - failed}/{len(checks.rows)} index checks pass ({target})"
    print(summary)
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else root
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_index_check.json").write_text(json.dumps({"summary": summary, "checks": checks.rows}, indent=1))
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile the plans and the export (here)")
    b.add_argument("--root", default=str(ROOT))
    b.add_argument("--target", default="cuda:sm_90a", help="cpu: the same checks without a GPU")
    r = sub.add_parser("run", help="run them on the GPU")
    r.add_argument("--root", default=str(ROOT))
    r.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    return build(args) if args.cmd == "build" else run(args)


def _readable(model: bytes | Path) -> bytes | str:
    """The model as the GPU machine's onnxruntime reads it: an IR version it knows (the
    onnx there may stamp a newer one than its onnxruntime reads; the ops are the same)."""
    if not isinstance(model, bytes):
        return str(model)
    import onnx

    proto = onnx.load_from_string(model)
    proto.ir_version = min(proto.ir_version, 10)
    return proto.SerializeToString()


if __name__ == "__main__":
    sys.exit(main())
