"""Real-size correctness on the GPU machine, without carrying the weights there.

    python benchmarks/gpu_real_check.py pack [--models bert gpt2 llama] [--batches 1] [--dtype float16]   # here
    PYTHONPATH=. python benchmarks/gpu_real_check.py run [--out DIR] [--root DIR]                        # on the H200

Real-size weights do not fit what travels to the GPU machine (64 MiB). ``pack`` compiles
the real config for cuda:sm_90a and keeps, under build/gpu_real_check/TAG/: the plan
without weights.safetensors, and the ONNX model as a skeleton whose float initializers of
more than 1024 elements have lost their data (names, dtypes and dims stay; the list is in
emptied.json). ``run`` refills each emptied initializer with seeded random values
(normal, std 0.02, seed from the name), imports, partitions, lowers and links the refilled
model with tilefuse against the carried kernels (emission is pure Python, so kernel names
match), which derives the plan's constants on the GPU machine exactly as the compiler
does; it then runs the plan and onnxruntime (CPU) on the same fresh random inputs and
compares every output with tilefuse.compare's tolerance for its dtype (float16: 1e-2 of
the output's scale). Exit status 1 on any mismatch.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent / "build" / "gpu_real_check"
TARGET = "cuda:sm_90a"
KEEP_ELEMENTS = 1024  # smaller initializers (norm scales, shapes, scalars) travel as they are
SEQ = 128


def _shapes(name: str, batch: int) -> dict:
    import models

    spec = models.ZOO[name]
    if "input_ids" not in spec.shapes("real"):  # images (CNNs, ViT): the real shapes at this batch
        return {k: (batch, *v[1:]) for k, v in spec.shapes("real").items()}
    return {"batch": batch, "seq": SEQ}


def pack(args) -> int:
    import onnx

    import models
    from tilefuse.compiler import compile_model

    for name in args.models:
        for batch in args.batches:
            tag = f"{name}-{args.dtype}-b{batch}"
            out = args.root / tag
            out.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            path = models.build(name, "real", args.dtype)
            shapes = _shapes(name, batch)
            compiled = compile_model(path, TARGET, shapes)
            compiled.plan.save(out / "plan.tfplan")
            (out / "plan.tfplan" / "weights.safetensors").unlink()
            model = onnx.load(str(path))
            emptied = []
            for init in model.graph.initializer:
                if init.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16) \
                        and int(np.prod(init.dims)) > KEEP_ELEMENTS:
                    for f in ("raw_data", "float_data", "int32_data"):
                        init.ClearField(f)
                    emptied.append(init.name)
            onnx.save(model, str(out / "skeleton.onnx"))
            (out / "emptied.json").write_text(json.dumps({"emptied": emptied, "shapes": shapes, "model": name}))
            print(f"{tag:24s} {len(compiled.plan.kernels)} kernels, {len(emptied)} initializers emptied, "
                  f"{(out / 'skeleton.onnx').stat().st_size / 2**20:.1f} MiB skeleton, {time.perf_counter() - t0:.0f} s",
                  flush=True)
    return 0


def refill(model, emptied: list[str]) -> None:
    """Seeded values for the emptied initializers (the same on any machine for one numpy):
    normal(0, 0.02), except BatchNormalization variances (uniform 0.5-1.5) and scales
    (1 + normal(0, 0.02))."""
    from onnx import helper, numpy_helper

    # BatchNormalization's variance must be positive (a negative one makes the reference
    # NaN) and its scale near 1 (scales of 0.02 would shrink ResNet's activations to noise)
    bn = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    variances = {n.input[4] for n in bn if len(n.input) > 4}
    scales = {n.input[1] for n in bn if len(n.input) > 1}
    for i, init in enumerate(model.graph.initializer):
        if init.name not in emptied:
            continue
        dtype = helper.tensor_dtype_to_np_dtype(init.data_type)
        rng = np.random.default_rng(zlib.crc32(init.name.encode()))
        if init.name in variances:
            data = rng.uniform(0.5, 1.5, tuple(init.dims)).astype(dtype)
        else:
            data = rng.standard_normal(tuple(init.dims), dtype=np.float32) * 0.02
            data = (data + 1 if init.name in scales else data).astype(dtype)
        model.graph.initializer[i].CopyFrom(numpy_helper.from_array(data, init.name))


def derive_weights(model, shapes: dict, plan_dir: Path) -> dict[str, np.ndarray]:
    """The plan's constants for ``model``: import, partition, lower and link it as the
    compiler does, binding the kernels the carried manifest names."""
    from tilefuse.codegen.artifact import KernelArtifact
    from tilefuse.codegen.cuda.emit import emit_tilelang
    from tilefuse.codegen.launch import decode_cuda
    from tilefuse.frontend import import_onnx
    from tilefuse.partition import partition_graph
    from tilefuse.partition.kinds import FusionKind
    from tilefuse.plan import link
    from tilefuse.plan.manifest import Decoder
    from tilefuse.plan.model import IndexSite
    from tilefuse.target import get_target
    from tilefuse.tile_ir import lower_group

    target = get_target(TARGET)
    manifest = json.loads((plan_dir / "manifest.json").read_text())
    built = {k["name"]: k for k in manifest["kernels"]}
    graph = import_onnx(model, shapes)
    partition = partition_graph(graph, target)
    groups = [g for g in partition.groups if g.kind is not FusionKind.OPAQUE]
    lowered = {g.id: lower_group(g, target) for g in groups}
    kernels = {}
    for g in groups:
        src = emit_tilelang(lowered[g.id].program)
        k = built.get(src.func)
        if k is None:
            raise SystemExit(f"kernel {src.func} is not in the carried plan: pack again with this commit")
        launch = decode_cuda(Decoder(manifest, "manifest.json", plan_dir), k["launch"], f"kernel {src.func}.launch",
                             len(k["params"]), k["symbol"])
        kernels[g.id] = KernelArtifact(src.func, k["symbol"], plan_dir / k["file"], src.params, launch)
    sites = {gid: tuple(IndexSite(s.what, s.extent) for s in low.sites) for gid, low in lowered.items()}
    plan = link(graph, partition, kernels, target.name, "", bindings={gid: low.bindings for gid, low in lowered.items()},
                sites=sites)
    want = {b["name"] for b in manifest["buffers"] if b["kind"] == "constant"}
    if set(plan.weights) != want:
        raise SystemExit(f"derived constants differ from the carried plan's: {sorted(set(plan.weights) ^ want)[:5]}")
    return plan.weights


def run(args) -> int:
    import onnx
    import onnxruntime as ort

    import models
    from tilefuse.compare import compare_output
    from tilefuse.plan import write_weights
    from tilefuse.runtime import InferenceSession

    out_dir = Path(args.out or os.environ.get("OUT") or args.root)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows, failed = [], 0
    for case in sorted(p for p in args.root.glob(args.match) if (p / "skeleton.onnx").exists()):
        meta = json.loads((case / "emptied.json").read_text())
        shapes = {k: tuple(v) if isinstance(v, list) else v for k, v in meta["shapes"].items()}
        t0 = time.perf_counter()
        model = onnx.load(str(case / "skeleton.onnx"))
        refill(model, meta["emptied"])
        plan_dir = case / "plan.tfplan"
        write_weights(plan_dir, derive_weights(model, shapes, plan_dir))  # and their hash, in the manifest
        seed = random.randrange(2**31)
        feeds = models.random_inputs(model, shapes, seed=seed)
        got = InferenceSession(plan_dir).run(None, feeds)
        so = ort.SessionOptions()
        so.intra_op_num_threads = os.cpu_count() or 1
        ref = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        names = [o.name for o in ref.get_outputs()]
        want = ref.run(names, feeds)
        checks = [compare_output(n, g, w) for n, g, w in zip(names, got, want)]
        ok = all(c.ok for c in checks)
        failed += not ok
        row = {"case": case.name, "ok": ok, "seed": seed, "seconds": round(time.perf_counter() - t0, 1),
               "outputs": {c.name: {"max_abs_error": c.max_abs_error, "scale": c.scale, "problem": c.problem}
                           for c in checks}}
        if not ok and args.probe:
            row["first_bad_kernel"] = probe(model, shapes, plan_dir, feeds)
        rows.append(row)
        detail = "  ".join(f"{c.name}:{c.max_abs_error:.2e}/{c.scale:.2e}" for c in checks)
        print(f"{case.name:24s} {'ok ' if ok else 'FAIL'}  {detail}  ({row['seconds']} s, seed {seed})", flush=True)
    print(f"{len(rows) - failed}/{len(rows)} real-size plans match onnxruntime")
    (out_dir / "gpu_real_check.json").write_text(json.dumps(rows, indent=1, default=float))
    return 1 if failed or not rows else 0


def probe(model, shapes: dict, plan_dir: Path, feeds: dict) -> dict | None:
    """Run the plan one kernel at a time and compare every kernel output with tilefuse's
    reference executor on the same graph: the first kernel whose output disagrees (or
    holds NaN/Inf where the reference has none), or None."""
    from tilefuse.compare import compare_output
    from tilefuse.frontend import import_onnx
    from tilefuse.reference import evaluate_all
    from tilefuse.runtime import InferenceSession

    graph = import_onnx(model, shapes)
    values = evaluate_all(graph, feeds)
    by_name = {v.name: values[id(v)] for n in graph.nodes for v in n.outputs if id(v) in values}
    sess = InferenceSession(plan_dir)
    sess.run(None, feeds)  # the inputs in place
    ex = sess._executor
    for step in ex.step_by_step():
        kernel = getattr(step, "kernel", None)  # host steps are numpy: not the suspects
        for b in step.outputs if kernel else ():
            want = by_name.get(ex.plan.buffers[b].name)
            if want is None:
                continue
            c = compare_output(ex.plan.buffers[b].name, ex.read_buffer(b), want)
            if not c.ok:
                bad = {"kernel": kernel, "output": c.name, "problem": c.problem}
                print(f"    first kernel that disagrees: {bad}", flush=True)
                return bad
    return None


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("pack")
    p.add_argument("--models", nargs="+", default=["bert", "gpt2", "llama"])
    p.add_argument("--batches", nargs="+", type=int, default=[1])
    p.add_argument("--dtype", default="float16")
    r = sub.add_parser("run")
    r.add_argument("--out")
    r.add_argument("--match", default="*", help="which packed cases to run (a glob)")
    for a in (p, r):
        a.add_argument("--root", type=Path, default=ROOT,
                       help="folder of packed cases (default build/gpu_real_check; several fit calls of <= 64 MiB)")
    r.add_argument("--probe", action="store_true", help="on a mismatch, find the first kernel that disagrees "
                   "with the reference executor (runs the plan kernel by kernel)")
    args = ap.parse_args()
    return pack(args) if args.cmd == "pack" else run(args)


if __name__ == "__main__":
    sys.exit(main())
