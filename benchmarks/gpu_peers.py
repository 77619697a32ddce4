"""Real-size models on the GPU machine: tilefuse CUDA plans timed there.

    python benchmarks/gpu_peers.py pack [--models bert gpt2] [--batches 1 32] [--dtype float16]   # here
    PYTHONPATH=. python benchmarks/gpu_peers.py run [--out DIR]                                  # on the H200

Real-size weights do not fit what travels to the GPU machine (64 MiB), so ``pack``
compiles each model here for cuda:sm_90a and keeps the plan without weights.safetensors
(build/gpu_real/MODEL-DTYPE-bN.tfplan); ``run`` synthesises the weights there from the
manifest's constant buffers (seeded normal(0, 0.02) for floats, zeros for integers: index
constants stay in range) and times the plan: CUDA events around N replays of its CUDA
graph, after warm-up; median, 10th and 90th percentiles. Values do not change the time
of these kernels (no data-dependent control flow). Correctness is checked on the tiny
configs by gpu_check.py, on real inputs and weights. ``--torch-batches 1 32`` also times
the plain-torch peers of ``--torch-models`` (benchmarks/torch_peers.py: the same
architectures, fp16) eager and under each ``--torch-modes`` torch.compile mode, on the
same GPU in the same run.

Besides each row, the roofline floor of the model at that shape: max(FLOPs / 790 TFLOP/s,
bytes / 4.3 TB/s), from the partition's cost model (tilefuse/target.py).
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
from torch_peers import spread  # noqa: E402  (torch imported only when a peer is timed)

ROOT = Path(__file__).resolve().parent.parent / "build" / "gpu_real"
SEQ = 128


def pack(args) -> int:
    import models
    from tilefuse.compiler import compile_model

    ROOT.mkdir(parents=True, exist_ok=True)
    from gpu_gemm import variant_target

    for name in args.models:
        for batch in args.batches:
            tag = f"{name}-{args.dtype}-b{batch}" + (f"-{args.variant}" if args.variant != "default" else "")
            t0 = time.perf_counter()
            path = models.build(name, "real", args.dtype)
            real = models.ZOO[name].shapes("real")  # token models at seq 128, the rest at their real shapes
            shapes = {"batch": batch, "seq": SEQ} if "input_ids" in real else {k: (batch, *v[1:]) for k, v in real.items()}
            compiled = compile_model(path, variant_target(args.variant), shapes)
            out = ROOT / f"{tag}.tfplan"
            compiled.plan.save(out)
            (out / "weights.safetensors").unlink()
            floor = _roofline(compiled)
            (out / "roofline.json").write_text(json.dumps(floor))
            print(f"{tag:28s} {len(compiled.plan.kernels)} kernels, {len(compiled.plan.steps)} steps, "
                  f"roofline {floor['floor_ms']:.3f} ms, packed in {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


def _roofline(compiled) -> dict:
    """The model's floor, and each kernel's (summed over the groups it runs): max(FLOPs /
    matrix rate, bytes / DRAM bandwidth) from the partition's cost model."""
    from tilefuse.plan.model import KernelStep
    from tilefuse.target import CUDA_SM90A as T

    def floor_ms(flops: float, nbytes: float) -> float:
        return 1e3 * max(flops / T.device.matrix_flops, nbytes / T.device.dram_bandwidth)

    flops = sum(g.cost.flops for g in compiled.partition.groups)
    nbytes = sum(g.cost.bytes for g in compiled.partition.groups)
    groups = {g.id: g for g in compiled.partition.groups}
    kernels: dict[str, float] = {}
    for step in compiled.plan.steps:
        if isinstance(step, KernelStep):
            g = groups[step.group]
            kernels[step.kernel] = kernels.get(step.kernel, 0.0) + floor_ms(g.cost.flops, g.cost.bytes)
    return {"flops": flops, "bytes": nbytes, "floor_ms": floor_ms(flops, nbytes), "kernels_floor_ms": kernels}


def prepare(plan_dir: Path, launch: str = "as-built"):
    """A session of a packed plan, its weights synthesised (seeded), and feeds for it."""
    from tilefuse.plan import write_weights
    from tilefuse.runtime import InferenceSession

    manifest = json.loads((plan_dir / "manifest.json").read_text())
    rng = np.random.default_rng(0)
    weights = {}
    for b in manifest["buffers"]:
        if b["kind"] == "constant":
            dt = np.dtype(b["dtype"]) if b["dtype"] != "bfloat16" else np.float32
            w = rng.standard_normal(b["shape"], dtype=np.float32) * 0.02 if dt.kind == "f" else np.zeros(b["shape"])
            weights[b["name"]] = np.ascontiguousarray(w.astype(dt))
    write_weights(plan_dir, weights)  # and their hash, in the manifest
    sess = InferenceSession(plan_dir, launch=launch)
    feeds = {}
    for i in sess.get_inputs():
        dtype = {"tensor(int64)": np.int64, "tensor(float16)": np.float16, "tensor(float)": np.float32}[i.type]
        feeds[i.name] = (np.ones(i.shape, dtype) if "mask" in i.name else
                         rng.integers(0, 100, i.shape).astype(dtype) if dtype is np.int64 else
                         rng.standard_normal(i.shape).astype(dtype))
    return sess, feeds


def _time_plan(plan_dir: Path, tag: str, args, launch: str = "as-built") -> dict:
    """Outputs finite and equal across replays, the median of timed graph replays, and
    each kernel's share (what holds the model back)."""
    manifest = json.loads((plan_dir / "manifest.json").read_text())
    sess, feeds = prepare(plan_dir, launch)
    outs = sess.run(None, feeds)
    finite = all(np.isfinite(o.astype(np.float32)).all() for o in outs)
    # the same inputs replayed: every replay of the graph gives the same bits
    replays_equal = all(all(np.array_equal(a, b) for a, b in zip(outs, sess.run(None, feeds)))
                        for _ in range(args.replays))
    ex = sess._executor
    ex.timed(20)
    row = {"model": tag, **spread(ex.timed(args.repeats)), "cuda_graph": ex._graph is not None,
           "kernels": len(manifest["kernels"]), "steps": len(manifest["steps"]), "finite_outputs": finite,
           "replays_equal": f"{args.replays} of {args.replays}" if replays_equal else "NO",
           **json.loads((plan_dir / "roofline.json").read_text())}
    per_kernel: dict[str, list[float]] = {}
    for kernel, ms in ex.timed_steps(20):
        per_kernel.setdefault(kernel, []).append(ms)
    floors = row.pop("kernels_floor_ms", {})
    row["kernels_ms"] = sorted(((k, sum(v), len(v), floors.get(k)) for k, v in per_kernel.items()),
                               key=lambda x: -x[1])
    for k, total, n, floor in row["kernels_ms"][:8]:  # what holds the model back
        against = f"roofline {floor:.3f} ms ({total / floor:5.1f}x)" if floor else "roofline n/a"
        print(f"    {k:44s} {n:3d} x {1e3 * total / n:7.1f} us = {total:7.3f} ms; {against}", flush=True)
    print(f"{tag:28s} {row['ms_median']:8.3f} ms (p10 {row['ms_p10']:.3f}, p90 {row['ms_p90']:.3f}); "
          f"roofline {row['floor_ms']:.3f} ms; {row['steps']} launches in one graph: {row['cuda_graph']}; "
          f"replays equal: {row['replays_equal']}", flush=True)
    return row


def run(args) -> int:
    root = Path(args.plans) if args.plans else ROOT
    out_dir = Path(args.out or os.environ.get("OUT") or root)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    launches = [("", "as-built")] + ([("-plainlaunch", "plain")] if args.plain_launch else [])
    for plan_dir in sorted(root.glob(args.match)):
        for suffix, launch in launches:
            rows.append(_time_plan(plan_dir, plan_dir.name.removesuffix(".tfplan") + suffix, args, launch))
    import torch_peers

    for name in args.torch_models:
        for batch in args.torch_batches:
            for mode in args.torch_modes:
                row = torch_peers.time_peer(name, batch, mode, args.repeats)
                rows.append(row)
                print(f"torch {name} b{batch} {mode:28s} {row['ms_median']:8.3f} ms", flush=True)
                (out_dir / "gpu_peers.json").write_text(json.dumps(rows, indent=1))  # kept if the call is cut short
    (out_dir / "gpu_peers.json").write_text(json.dumps(rows, indent=1))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--models", nargs="+", default=["bert"])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 32])
    p.add_argument("--dtype", default="float16")
    p.add_argument("--variant", default="default", help="code-generation knobs, as in gpu_gemm.py --variants")
    r = sub.add_parser("run")
    r.add_argument("--out")
    r.add_argument("--plans", help="folder of packed plans (default build/gpu_real)")
    r.add_argument("--match", default="*.tfplan", help="which plans of that folder to run (a glob)")
    r.add_argument("--repeats", type=int, default=100)
    r.add_argument("--replays", type=int, default=100, help="runs whose outputs must equal the first, bit for bit")
    r.add_argument("--plain-launch", action="store_true",
                   help="also time each plan with every kernel launched in plain stream order (no programmatic launch)")
    r.add_argument("--torch-models", nargs="*", default=["bert"], help="plain-torch peers (benchmarks/torch_peers.py)")
    r.add_argument("--torch-batches", nargs="*", type=int, default=[], help="batches to time the peers at")
    r.add_argument("--torch-modes", nargs="+", default=["eager", "default", "max-autotune-no-cudagraphs",
                                                        "reduce-overhead"])
    args = ap.parse_args()
    return pack(args) if args.cmd == "pack" else run(args)


if __name__ == "__main__":
    sys.exit(main())
