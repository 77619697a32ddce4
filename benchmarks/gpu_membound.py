"""Memory-bound groups on the GPU machine: achieved bandwidth against the measured 4.3 TB/s.

    python benchmarks/gpu_membound.py pack [--cases layernorm softmax ...]   # here
    PYTHONPATH=. python benchmarks/gpu_membound.py run [--out DIR]             # on the H200

``pack`` builds one-group fp16 ONNX models (seeded; small constants only, so the plans
travel with their weights), compiles each for cuda:sm_90a and keeps the plan
(build/gpu_membound/CASE.tfplan) beside the model. ``run`` feeds fresh random inputs,
checks every output against onnxruntime (CPU) with tilefuse.compare's float16 tolerance,
and times the plan (CUDA graph replays, median of ``--repeats``): bandwidth counts each
input and output tensor once (bytes a kernel must move at least), against 4.3 TB/s.

The issue's bar: memory-bound groups (elementwise chains, softmax, LayerNorm) at >= 80% of
4.3 TB/s. bert-base's own LayerNorm (4096 x 768, 12.6 MB) is there too: at that size a
kernel's fixed costs (launch, one DRAM round trip before the first write) weigh.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent / "build" / "gpu_membound"
BANDWIDTH = 4.3e12  # B/s, measured on the H200 (issue 3)


def _model(case: str):
    """(ONNX model, description) for one case; fp16 tensors, fp16 constants."""
    from onnx import TensorProto, helper, numpy_helper

    h = TensorProto.FLOAT16
    rng = np.random.default_rng(0)

    def const(name, shape):
        return numpy_helper.from_array((1 + 0.1 * rng.standard_normal(shape)).astype(np.float16), name)

    if case in ("layernorm", "add_layernorm", "bert_layernorm"):
        rows = 4096 if case == "bert_layernorm" else 65536
        ins = [helper.make_tensor_value_info("x", h, [rows, 768])]
        nodes, src = [], "x"
        if case == "add_layernorm":
            ins.append(helper.make_tensor_value_info("r", h, [rows, 768]))
            nodes.append(helper.make_node("Add", ["x", "r"], ["s"]))
            src = "s"
        nodes.append(helper.make_node("LayerNormalization", [src, "g", "b"], ["y"], axis=-1, epsilon=1e-5))
        inits = [const("g", [768]), const("b", [768])]
        out = helper.make_tensor_value_info("y", h, [rows, 768])
        what = f"{'x + r, ' if case == 'add_layernorm' else ''}LayerNorm over [{rows}, 768]"
    elif case == "softmax":
        ins = [helper.make_tensor_value_info("x", h, [262144, 128])]
        nodes = [helper.make_node("Softmax", ["x"], ["y"], axis=-1)]
        inits, out, what = [], helper.make_tensor_value_info("y", h, [262144, 128]), "softmax over [262144, 128]"
    elif case == "gelu":
        ins = [helper.make_tensor_value_info("x", h, [16384, 4096])]
        nodes = [helper.make_node("Div", ["x", "s2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                 helper.make_node("Add", ["e", "one"], ["p"]), helper.make_node("Mul", ["x", "p"], ["q"]),
                 helper.make_node("Mul", ["q", "half"], ["y"])]
        inits = [numpy_helper.from_array(np.array(v, np.float16), n) for n, v in (("s2", 1.4142135), ("one", 1.0), ("half", 0.5))]
        out, what = helper.make_tensor_value_info("y", h, [16384, 4096]), "exact GELU over [16384, 4096]"
    elif case == "bias_add":
        ins = [helper.make_tensor_value_info("x", h, [16384, 4096]), helper.make_tensor_value_info("r", h, [16384, 4096])]
        nodes = [helper.make_node("Add", ["x", "b"], ["t"]), helper.make_node("Add", ["t", "r"], ["y"])]
        inits = [const("b", [4096])]
        out, what = helper.make_tensor_value_info("y", h, [16384, 4096]), "x + bias + r over [16384, 4096]"
    else:
        raise SystemExit(f"unknown case {case}")
    graph = helper.make_graph(nodes, case, ins, [out], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), what


CASES = ["layernorm", "add_layernorm", "softmax", "gelu", "bias_add", "bert_layernorm"]


def pack(args) -> int:
    import onnx

    from tilefuse.compiler import compile_model

    ROOT.mkdir(parents=True, exist_ok=True)
    for case in args.cases:
        t0 = time.perf_counter()
        model, what = _model(case)
        onnx.checker.check_model(model)
        compiled = compile_model(model.SerializeToString(), "cuda:sm_90a", {})
        out = ROOT / f"{case}.tfplan"
        compiled.plan.save(out)
        onnx.save(model, str(ROOT / f"{case}.onnx"))
        notes = [n for low in compiled.lowered.values() for n in low.program.notes]
        (out / "case.json").write_text(json.dumps({"case": case, "what": what, "notes": notes}))
        print(f"{case:16s} {len(compiled.plan.kernels)} kernel(s), {what}; {notes[:1]}; {time.perf_counter() - t0:.0f} s",
              flush=True)
    return 0


def run(args) -> int:
    import onnxruntime as ort

    from tilefuse.compare import compare_output
    from tilefuse.runtime import InferenceSession
    from torch_peers import spread

    out_dir = Path(args.out or os.environ.get("OUT") or ROOT)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, failed = [], 0
    for plan_dir in sorted(ROOT.glob("*.tfplan")):
        meta = json.loads((plan_dir / "case.json").read_text())
        sess = InferenceSession(plan_dir)
        rng = np.random.default_rng()
        feeds = {i.name: rng.standard_normal(i.shape).astype(np.float16) for i in sess.get_inputs()}
        (got,) = sess.run(None, feeds)
        (want,) = ort.InferenceSession(str(ROOT / f"{meta['case']}.onnx"), providers=["CPUExecutionProvider"]).run(None, feeds)
        check = compare_output("y", got, want)
        failed += not check.ok
        ex = sess._executor
        ex.timed(20)
        timing = spread(ex.timed(args.repeats))
        nbytes = sum(a.nbytes for a in feeds.values()) + got.nbytes
        row = {**meta, **timing, "bytes": nbytes, "tb_per_s": nbytes / timing["ms_median"] / 1e9,
               "of_peak": nbytes / timing["ms_median"] / 1e-3 / BANDWIDTH, "kernels": len(ex.plan.steps),
               "ok": check.ok, "rel_err": check.relative_error}
        rows.append(row)
        print(f"{meta['case']:16s} {timing['ms_median'] * 1e3:8.1f} us {nbytes / 2**20:7.1f} MiB {row['tb_per_s']:5.2f} TB/s "
              f"({100 * row['of_peak']:3.0f}% of 4.3) err {check.relative_error:.1e} {'ok' if check.ok else 'WRONG'}  "
              f"{meta['what']}", flush=True)
    (out_dir / "gpu_membound.json").write_text(json.dumps(rows, indent=1))
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--cases", nargs="+", default=CASES, choices=CASES)
    r = sub.add_parser("run")
    r.add_argument("--out")
    r.add_argument("--repeats", type=int, default=100)
    args = ap.parse_args()
    return pack(args) if args.cmd == "pack" else run(args)


if __name__ == "__main__":
    sys.exit(main())
