"""Products on the GPU machine: tilefuse's GEMM + epilogue kernels against cuBLAS.

    python benchmarks/gpu_gemm.py pack [--variants default] [--shapes ffn_up ffn_down square]  # here
    PYTHONPATH=. python benchmarks/gpu_gemm.py run [--out DIR]                                  # on the H200

``pack`` builds one-product ONNX models (fp16), compiles each for cuda:sm_90a under each
code-generation variant (``variant_target``: the policies and options of the target that a
change to the product schedule would move) and keeps the plans without weights
(build/gpu_gemm/SHAPE-VARIANT.tfplan). ``run`` synthesises weights and inputs there
(seeded normal), runs every plan in a child process (a kernel that hangs costs its
timeout, not the call), checks the output against torch in float32 on the same GPU
(1e-2 relative to the output's scale), and times it (CUDA graph replays, median of
``--repeats``), beside cuBLAS through torch on the bare product (``torch.matmul``) and
on the product with the same epilogue in eager torch. TFLOP/s counts 2*M*N*K.

The issue's bar: GEMM + epilogue >= 90% of cuBLAS's throughput on large shapes.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from torch_peers import event_times, spread  # noqa: E402  (torch imported only when called)

ROOT = Path(__file__).resolve().parent.parent / "build" / "gpu_gemm"

# name: (M rows as [batch, seq] or [m], K, N, epilogue)
SHAPES = {
    "ffn_up": ((32, 128), 768, 3072, "bias_gelu"),  # bert-base batch 32 FFN-up
    "ffn_down": ((32, 128), 3072, 768, "bias_residual"),  # bert-base batch 32 FFN-down
    "qkv": ((32, 128), 768, 2304, "bias"),  # the three projections as one product
    "proj": ((32, 128), 768, 768, "bias_residual"),  # bert-base batch 32 attention output projection
    "square": ((2048,), 2048, 2048, "none"),  # the 2048^3
    "big": ((8192,), 8192, 8192, "none"),
}


def _model(shape: str) -> bytes:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rows, k, n, epi = SHAPES[shape]
    rng = np.random.default_rng(0)
    h = TensorProto.FLOAT16
    x = helper.make_tensor_value_info("x", h, [*rows, k])
    y = helper.make_tensor_value_info("y", h, [*rows, n])
    inits = [numpy_helper.from_array((rng.standard_normal((k, n)) * 0.02).astype(np.float16), "w")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p" if epi != "none" else "y"])]
    inputs = [x]
    if epi != "none":
        inits.append(numpy_helper.from_array((rng.standard_normal(n) * 0.02).astype(np.float16), "b"))
        nodes.append(helper.make_node("Add", ["p", "b"], ["pb" if epi != "bias" else "y"]))
    if epi == "bias_gelu":
        for name, v in (("half", 0.5), ("one", 1.0), ("rsqrt2", 0.7071067811865476)):
            inits.append(numpy_helper.from_array(np.array(v, np.float16), name))
        nodes += [helper.make_node("Mul", ["pb", "rsqrt2"], ["s"]), helper.make_node("Erf", ["s"], ["e"]),
                  helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["pb", "e1"], ["g"]),
                  helper.make_node("Mul", ["g", "half"], ["y"])]
    if epi == "bias_residual":
        inputs.append(helper.make_tensor_value_info("r", h, [*rows, n]))
        nodes.append(helper.make_node("Add", ["pb", "r"], ["y"]))
    g = helper.make_graph(nodes, shape, inputs, [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(m)
    return m.SerializeToString()


# variant name parts: "prefixN" sets an integer field, a flag word sets a field to a value;
# each is a (part, field) of the target (tilefuse.target.adjust)
NUMBERS = {"rt": "rows__threads", "re": "rows__tile_elems", "mb": "codegen__min_blocks_per_sm",
           "kv": "attention__key_tile", "qt": "attention__query_tile", "ow": "attention__one_wave_occupancy",
           "wv": "codegen__vector_bytes", "bm": "gemm__force_tile_m", "bn": "gemm__force_tile_n",
           "pb": "codegen__producer_blocks_per_sm", "ps": "gemm__producer_steps", "fr": "codegen__fma_registers"}
FLAGS = {"tma": ("codegen__tma_pipelines", True), "mirror": ("codegen__epilogue_in_registers", False),
         "nowarp": ("codegen__warp_rows", False), "nopad": ("codegen__staging_pad", False),
         "noregrows": ("codegen__register_rows", False), "nocache": ("codegen__cache_rows", False),
         "pdl": ("codegen__programmatic_launch", "release-first"), "pdlwait": ("codegen__programmatic_launch", "wait-first"),
         "noerfsum": ("codegen__fast_erf_sum", False), "fmashared": ("codegen__fma_registers", 0),
         "s3": ("gemm__inflight_bytes", 100 * 1024), "s3k128": ("gemm__inflight_bytes", 200 * 1024)}


def variant_target(name: str):
    """The sm_90a target of one code-generation variant ("default", or parts joined by "-":
    e.g. "bm64-nopad", "ps0", "pt128x128"): built with ``adjust``, nothing patched."""
    from tilefuse.target import CUDA_SM90A, adjust

    changes: dict[str, object] = {}
    for part in [] if name == "default" else name.split("-"):
        if part in FLAGS:
            key, value = FLAGS[part]
            changes[key] = value
        elif part[:2] == "pt" and "x" in part:
            changes["gemm__producer_tile"] = tuple(int(x) for x in part[2:].split("x"))
        elif part[:2] in NUMBERS and part[2:].isdigit():
            changes[NUMBERS[part[:2]]] = int(part[2:])
        else:
            raise SystemExit(f"unknown variant part {part!r} of {name!r}")
    return adjust(CUDA_SM90A, **changes)


def pack(args) -> int:
    from tilefuse.compiler import compile_model

    ROOT.mkdir(parents=True, exist_ok=True)
    for shape in args.shapes:
        model = _model(shape)
        for variant in args.variants:
            t0 = time.perf_counter()
            compiled = compile_model(model, variant_target(variant))
            out = ROOT / f"{shape}-{variant}.tfplan"
            compiled.plan.save(out)
            (out / "weights.safetensors").unlink()
            notes = [n for low in compiled.lowered.values() for n in low.program.notes]
            (out / "variant.json").write_text(json.dumps({"shape": shape, "variant": variant, "notes": notes}))
            print(f"{shape}-{variant}: {len(compiled.plan.kernels)} kernels, {notes}, "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)
    return 0


def _inputs(sess, rng) -> dict:
    return {i.name: rng.standard_normal(i.shape).astype(np.float16) for i in sess.get_inputs()}


def run_one(plan_dir: Path, repeats: int) -> dict:
    """One plan in this process: weights, a correctness check against torch, timings."""
    import torch

    from tilefuse.plan import write_weights
    from tilefuse.runtime import InferenceSession

    meta = json.loads((plan_dir / "variant.json").read_text())
    rows, k, n, epi = SHAPES[meta["shape"]]
    rng = np.random.default_rng(0)
    manifest = json.loads((plan_dir / "manifest.json").read_text())
    constants = [b for b in manifest["buffers"] if b["kind"] == "constant"]
    if any(b["shape"] == [] for b in constants):  # the GELU's scalars fold into the kernel
        raise SystemExit(f"{plan_dir.name}: a scalar constant is a plan buffer; its value cannot be synthesised")
    weights = {b["name"]: (rng.standard_normal(b["shape"]) * 0.02).astype(np.dtype(b["dtype"])) for b in constants}
    write_weights(plan_dir, weights)  # and their hash, in the manifest
    sess = InferenceSession(plan_dir)
    feeds = _inputs(sess, rng)
    (y,) = sess.run(None, feeds)
    t = {name: torch.from_numpy(v).cuda().float() for name, v in {**weights, **feeds}.items()}
    ref = t["x"] @ t["w"]
    if epi != "none":
        ref = ref + t["b"]
    if epi == "bias_gelu":
        ref = ref * 0.5 * (1 + torch.erf(ref * 0.7071067811865476))
    if epi == "bias_residual":
        ref = ref + t["r"]
    ref = ref.cpu().numpy()
    err = float(np.abs(y.astype(np.float32) - ref).max() / max(np.abs(ref).max(), 1e-6))
    ex = sess._executor
    ex.timed(20)
    times = ex.timed(repeats)
    kernels = {}
    for kernel, ms in ex.timed_steps(repeats):
        kernels.setdefault(kernel, []).append(ms)
    m = int(np.prod(rows))
    flops = 2 * m * n * k
    timing = spread(times)
    return {"plan": plan_dir.name, **meta, **timing, "tflops": flops / timing["ms_median"] / 1e9, "rel_err": err,
            "ok": err <= 1e-2, "kernels_ms": {kname: statistics.median(v) for kname, v in kernels.items()}}


def _torch_peers(shape: str, repeats: int) -> list[dict]:
    import torch

    rows, k, n, epi = SHAPES[shape]
    m = int(np.prod(rows))
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", dtype=torch.float16, generator=g)
    w = torch.randn(k, n, device="cuda", dtype=torch.float16, generator=g) * 0.02
    b = torch.randn(n, device="cuda", dtype=torch.float16, generator=g) * 0.02
    r = torch.randn(m, n, device="cuda", dtype=torch.float16, generator=g)

    def epilogue():
        y = torch.addmm(b, x, w) if epi != "none" else x @ w
        if epi == "bias_gelu":
            y = torch.nn.functional.gelu(y)
        if epi == "bias_residual":
            y = y + r
        return y

    out = []
    for peer, fn in (("cublas matmul", lambda: x @ w), ("torch eager, same epilogue", epilogue)):
        timing = spread(event_times(fn, repeats, warmup=20))
        out.append({"shape": shape, "peer": peer, **timing, "tflops": 2 * m * n * k / timing["ms_median"] / 1e9})
    return out


def run(args) -> int:
    out_dir = Path(args.out or os.environ.get("OUT") or ROOT)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, shapes = [], []
    for plan_dir in sorted(ROOT.glob("*.tfplan")):
        cmd = [sys.executable, __file__, "run-one", str(plan_dir), "--repeats", str(args.repeats)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            if done.returncode != 0:
                row = {"plan": plan_dir.name, "error": done.stderr.strip()[-2000:]}
            else:
                row = json.loads(done.stdout.strip().splitlines()[-1])
        except subprocess.TimeoutExpired:
            row = {"plan": plan_dir.name, "error": f"no result within {args.timeout} s (a hang?)"}
        rows.append(row)
        shape = json.loads((plan_dir / "variant.json").read_text())["shape"]
        if shape not in shapes:
            shapes.append(shape)
        if "error" in row:
            print(f"{row['plan']:32s} FAILED: {row['error'][-300:]}", flush=True)
        else:
            print(f"{row['plan']:32s} {row['ms_median'] * 1e3:8.1f} us {row['tflops']:6.0f} TFLOP/s "
                  f"err {row['rel_err']:.1e} {'ok' if row['ok'] else 'WRONG'}  {row['notes']}", flush=True)
    for shape in shapes:
        for row in _torch_peers(shape, args.repeats):
            rows.append(row)
            print(f"{shape + ' ' + row['peer']:32s} {row['ms_median'] * 1e3:8.1f} us {row['tflops']:6.0f} TFLOP/s", flush=True)
    (out_dir / "gpu_gemm.json").write_text(json.dumps(rows, indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--shapes", nargs="+", default=["ffn_up", "ffn_down", "qkv", "square"], choices=sorted(SHAPES))
    p.add_argument("--variants", nargs="+", default=["default"],
                   help="'-'-joined knobs: tma (TMA + warp specialisation), mirror (epilogue through shared "
                        "memory), s3 / s3k128 (3-stage K loops of 64 / 128), kvN (attention key tiles of N), mbN (N blocks per SM), rtN / reN (row tiles: N threads / N elements); "
                        "'default' is the shipped schedule")
    r = sub.add_parser("run")
    r.add_argument("--out")
    r.add_argument("--repeats", type=int, default=100)
    r.add_argument("--timeout", type=int, default=120)
    o = sub.add_parser("run-one")
    o.add_argument("plan")
    o.add_argument("--repeats", type=int, default=100)
    args = ap.parse_args()
    if args.cmd == "run-one":
        print(json.dumps(run_one(Path(args.plan), args.repeats)))
        return 0
    return pack(args) if args.cmd == "pack" else run(args)


if __name__ == "__main__":
    sys.exit(main())
