"""Convolutions at their tile edges as a CUDA plan, built here and checked on a GPU machine.

    python benchmarks/gpu_conv_check.py build        # any machine with nvcc + tilelang
    PYTHONPATH=. python benchmarks/gpu_conv_check.py run [--out DIR]   # the GPU machine

``build`` takes the convolutions of the default grid of tests/compiler/conv_grid.py (1-D
and 2-D, every padding, stride, dilation and grouping at output sizes around the tile
edges) whose cuda:sm_90a kernels hold the cases the tile interpreter checks there only
by their semantics: 1-D depthwise position tiles that branch on the tile number for
their per-tap bounds, and partial last column tiles of output channels. With a 1-D
[2, 8, 1000] depthwise convolution (the issue's case) they become one model, compiled
into build/gpu_conv/convs.tfplan, beside it the inputs and onnxruntime's outputs
(convs.npz, SAME with dilations given to onnxruntime as its explicit pads); a case whose
kernel TileLang cannot lower is left out and named. ``run``
loads the plan, compares every output with onnxruntime's (float32: 1e-4 of the output's
scale) and writes results.json (to --out, default $OUT or build/gpu_conv). Exit status 1
on any mismatch.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent / "build" / "gpu_conv"
SEED = 7


def _cases():
    from tests.compiler import conv_grid
    from tilefuse.errors import GraphError
    from tilefuse.frontend import import_onnx
    from tilefuse.partition import partition_graph
    from tilefuse.target import CUDA_SM90A
    from tilefuse.tile_ir import lower_group
    from tilefuse.tile_ir.ir import If, statements

    grid = [c for rank in (1, 2) for cases in conv_grid.batches(rank, full=False, per_model=32).values() for c in cases]
    graph = import_onnx(conv_grid.model(grid, 0), {f"x{i}": c.x_shape for i, c in enumerate(grid)})
    picked = [conv_grid.case((1000,), 8, 8, 3, 1, 1, "symmetric", "depthwise", batch=2)]
    for group in partition_graph(graph, CUDA_SM90A).groups:
        try:
            p = lower_group(group, CUDA_SM90A).program
        except GraphError:  # no schedule on the GPU at this size (a grouped convolution staged)
            continue
        if any(isinstance(s, If) for s in statements(p.body)) or "last column tile" in p.notes[0]:
            picked.append(grid[int(group.outputs[0].name[1:])])
    return picked


def build(args) -> int:
    import onnxruntime as ort

    from tests.compiler import conv_grid
    from tilefuse.compiler import compile
    from tilefuse.errors import CompileError

    ROOT.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    cases = []
    for c in _cases():  # one at a time: a kernel TileLang cannot lay out drops its case only
        try:
            compile(conv_grid.model([c], SEED), "cuda:sm_90a")
            cases.append(c)
        except CompileError as e:
            print(f"not built: {c.name}: {str(e).splitlines()[-1][:200]}", flush=True)
    feeds = conv_grid.feeds(cases, SEED + 1)
    ref = ort.InferenceSession(conv_grid.model(cases, SEED, for_reference=True).SerializeToString(),
                               providers=["CPUExecutionProvider"])
    want = ref.run(None, feeds)
    plan = compile(conv_grid.model(cases, SEED), "cuda:sm_90a")
    plan.save(ROOT / "convs.tfplan")
    np.savez(ROOT / "convs.npz", **{f"in:{k}": v for k, v in feeds.items()},
             **{f"out:y{i}": w for i, w in enumerate(want)})
    (ROOT / "cases.json").write_text(json.dumps([c.name for c in cases], indent=1))
    print(f"{len(cases)} convolutions, {len(plan.kernels)} kernels, built in {time.perf_counter() - t0:.0f} s")
    return 0


def run(args) -> int:
    from models.reference import load_reference
    from tilefuse.compare import compare_output
    from tilefuse.runtime import InferenceSession

    out_dir = Path(args.out or os.environ.get("OUT") or ROOT)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = json.loads((ROOT / "cases.json").read_text())
    feeds, expected = load_reference(ROOT / "convs.npz")
    outputs = sorted(expected, key=lambda n: int(n[1:]))
    got = InferenceSession(ROOT / "convs.tfplan").run(outputs, feeds)
    rows = []
    for name, out, g in zip(names, outputs, got):
        c = compare_output(out, g, expected[out])
        rows.append({"case": name, "ok": c.ok, "max_abs_err": c.max_abs_error, "problem": c.problem})
        print(f"{'ok' if c.ok else 'MISMATCH':8s} {c.max_abs_error:.2e}  {name}  {c.problem}")
    (out_dir / "results.json").write_text(json.dumps(rows, indent=1))
    failed = sum(not r["ok"] for r in rows)
    print(f"{len(rows) - failed}/{len(rows)} convolutions match onnxruntime")
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build")
    r = sub.add_parser("run")
    r.add_argument("--out")
    args = ap.parse_args()
    return build(args) if args.cmd == "build" else run(args)


if __name__ == "__main__":
    sys.exit(main())
