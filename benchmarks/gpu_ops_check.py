"""Single ops at the sizes users meet them, as CUDA plans: built here, checked and timed on a GPU.

    python benchmarks/gpu_ops_check.py build [--precision fp16]     # any machine with nvcc + tilelang
    PYTHONPATH=. python benchmarks/gpu_ops_check.py run [--only S]  # the GPU machine (onnxruntime there)

The cases are the ones that ran on one GPU thread or had no GPU schedule before session 17:
an LLM's greedy pick (ArgMax over 128 x 32,000 logits), a detector's classes (ArgMax over
80 of 4 x 80 x 8,400 scores), a segmentation map's classes, KV-cache writes (ScatterND of
rows), a ScatterElements with a reduction, a grouped transposed convolution (64 -> 32
channels in 2 groups, 32 x 32 -> 64 x 64); and reductions over leading axes (a column sum,
a time-major mean over 3,000 frames, a per-channel sum). ``build`` writes each model and its plan to
build/gpu_ops/ (a plan compiled with --precision fp16 is NAME-as-fp16); ``run`` draws fresh
random inputs (index inputs within the ranges the model records; values exact in float16
for the fp16 plans, so both see the same numbers and break ties alike), compares every
output with onnxruntime's on the machine (index outputs exactly), times the whole plan as a
CUDA graph's replay (``plan_us``, the median of 50) and each kernel with CUDA events
(``kernels_us``: launched from Python one after another, about 9 us a launch at the least),
and writes ops.json to $OUT.
Exit status 1 if any plan fails to build or to match.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent / "build" / "gpu_ops"


def _models() -> dict:
    """name -> (ModelProto, index ranges)."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h

    def model(nodes, inputs, outputs, inits=()):
        m = h.make_model(h.make_graph(nodes, "op", inputs, outputs, list(inits)), opset_imports=[h.make_opsetid("", 18)])
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m

    vi, F, I = h.make_tensor_value_info, T.FLOAT, T.INT64
    deconv_w = h.make_tensor("w", F, [64, 16, 4, 4],
                             np.random.default_rng(0).standard_normal(64 * 16 * 16).astype(np.float32).tolist())
    return {
        "grouped_deconv": (model([h.make_node("ConvTranspose", ["x", "w"], ["y"], group=2, strides=[2, 2], pads=[1, 1, 1, 1])],
                                 [vi("x", F, [1, 64, 32, 32])], [vi("y", F, [1, 32, 64, 64])], [deconv_w]), {}),
        "greedy": (model([h.make_node("ArgMax", ["logits"], ["tok"], axis=-1, keepdims=0)],
                         [vi("logits", F, [128, 32000])], [vi("tok", I, [128])]), {}),
        "det_classes": (model([h.make_node("ArgMax", ["scores"], ["cls"], axis=1, keepdims=0)],
                              [vi("scores", F, [4, 80, 8400])], [vi("cls", I, [4, 8400])]), {}),
        "seg_classes": (model([h.make_node("ArgMax", ["x"], ["y"], axis=1, keepdims=1)],
                              [vi("x", F, [2, 19, 256, 256])], [vi("y", I, [2, 1, 256, 256])]), {}),
        "kv_scatter": (model([h.make_node("ScatterND", ["cache", "pos", "new"], ["y"])],
                             [vi("cache", F, [2048, 256]), vi("pos", I, [16, 1]), vi("new", F, [16, 256])],
                             [vi("y", F, [2048, 256])]), {"pos": [-2048, 2048]}),
        "kv_scatter_heads": (model([h.make_node("ScatterND", ["cache", "pos", "new"], ["y"])],
                                   [vi("cache", F, [8, 1024, 64]), vi("pos", I, [8, 4, 2]), vi("new", F, [8, 4, 64])],
                                   [vi("y", F, [8, 1024, 64])]), {"pos": [0, 8]}),
        "column_sum": (model([h.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
                             [vi("x", F, [4096, 512])], [vi("y", F, [512])], [h.make_tensor("axes", I, [1], [0])]), {}),
        "time_major_mean": (model([h.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=1)],
                                  [vi("x", F, [3000, 4, 512])], [vi("y", F, [1, 4, 512])],
                                  [h.make_tensor("axes", I, [1], [0])]), {}),
        "channel_sum": (model([h.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)],
                              [vi("x", F, [8, 64, 56, 56])], [vi("y", F, [1, 64, 1, 1])],
                              [h.make_tensor("axes", I, [3], [0, 2, 3])]), {}),
        "scatter_elements_add": (model([h.make_node("ScatterElements", ["d", "i", "u"], ["y"], axis=1, reduction="add")],
                                       [vi("d", F, [64, 1024]), vi("i", I, [64, 8]), vi("u", F, [64, 8])],
                                       [vi("y", F, [64, 1024])]), {"i": [-1024, 1024]}),
    }


def build(args) -> int:
    import onnx
    from onnx import helper

    from models.spec import META_RANGES
    from tilefuse.compiler import compile

    ROOT.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name, (model, ranges) in _models().items():
        helper.set_model_props(model, {META_RANGES: json.dumps(ranges)})
        onnx.save(model, ROOT / f"{name}.onnx")
        tag = name + (f"-as-{args.precision}" if args.precision != "fp32" else "")
        try:
            plan = compile(ROOT / f"{name}.onnx", "cuda:sm_90a", precision=args.precision)
            plan.save(ROOT / f"{tag}.tfplan")
            print(f"{tag:32s} built: {len(plan.kernels)} kernels", flush=True)
        except Exception as e:  # report every case, then fail
            failed += 1
            print(f"{tag:32s} FAILED to build: {type(e).__name__}: {str(e)[:2000]}", flush=True)
    return 1 if failed else 0


def run(args) -> int:
    import onnxruntime as ort

    import models
    from tilefuse.compare import compare_output
    from tilefuse.runtime import InferenceSession

    out_dir = Path(args.out or os.environ.get("OUT") or ROOT)
    out_dir.mkdir(parents=True, exist_ok=True)
    results, failed = [], 0
    for plan in sorted(ROOT.glob("*.tfplan")):
        tag = plan.name.removesuffix(".tfplan")
        if args.only and args.only not in tag:
            continue
        name, _, precision = tag.removeprefix("before-").partition("-as-")  # before-NAME: a plan from another commit
        half = precision == "fp16"
        source = ROOT / f"{name}.onnx"
        feeds = models.random_inputs(source, {}, seed=int.from_bytes(os.urandom(4), "little"))
        if half:
            feeds = {k: v.astype(np.float16).astype(np.float32) if v.dtype == np.float32 else v for k, v in feeds.items()}
        ref = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
        want = dict(zip([o.name for o in ref.get_outputs()], ref.run(None, feeds)))
        row: dict = {"plan": tag}
        ok_all = True
        try:
            sess = InferenceSession(str(plan))
            got = dict(zip(want, sess.run(None, feeds)))
            for k, w in want.items():
                if w.dtype.kind in "iub":
                    ok, err = bool(np.array_equal(got[k], w)), int((got[k] != w).sum())
                else:
                    c = compare_output(k, got[k], w.astype(got[k].dtype), precision=precision or "fp32")
                    ok, err = c.ok, float(c.max_abs_error)
                row[k] = {"ok": ok, "error": err}
                ok_all = ok_all and ok
            executor = sess._executor
            executor.timed(5)  # warm-up
            row["plan_us"] = round(1e3 * statistics.median(executor.timed(50)), 2)  # a CUDA graph's replay
            row["kernels_us"] = [(kernel, round(1e3 * ms, 2)) for kernel, ms in executor.timed_steps(20)]
        except Exception as e:  # report every plan, then fail
            row["error"] = f"{type(e).__name__}: {e}"[:2000]
            ok_all = False
        failed += not ok_all
        print(json.dumps(row), flush=True)
        results.append(row)
    (out_dir / "ops.json").write_text(json.dumps(results, indent=1))
    print(f"{len(results) - failed}/{len(results)} plans match onnxruntime")
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--precision", default="fp32", help="compile with --precision (fp16, bf16, tf32)")
    r = sub.add_parser("run")
    r.add_argument("--out")
    r.add_argument("--only", help="plans whose name contains this")
    args = ap.parse_args()
    return build(args) if args.cmd == "build" else run(args)


if __name__ == "__main__":
    sys.exit(main())
