"""The zoo's kernels as emitted, fingerprinted: what a refactor that keeps behaviour must not change.

    python tools/kernel_digest.py write FILE [--models NAME:CONFIG ... | --all] [--targets cpu cuda:sm_90a]
    python tools/kernel_digest.py compare OLD NEW

``write`` imports each zoo model (float32; the cached ONNX files, built by ``python -m models
build`` where missing), partitions, lowers and emits every kernel for each target and
precision (cpu fp32; cuda:sm_90a fp32 and fp16), without compiling, and records per model
and target each kernel's program name, emitted name and sha256 of its emitted source (C for
the CPU, TileLang for CUDA). ``compare`` lists what differs and exits 1 if anything does.
The steps of docs/plans/schedules-as-data.md that promise identical kernels are checked so.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import models  # noqa: E402
from tilefuse.frontend import import_onnx  # noqa: E402
from tilefuse.frontend.loader import load_model  # noqa: E402
from tilefuse.frontend.precision import precision_target, with_precision  # noqa: E402
from tilefuse.ir.control import Branch  # noqa: E402
from tilefuse.partition import partition_graph  # noqa: E402
from tilefuse.partition.kinds import FusionKind  # noqa: E402
from tilefuse.target import get_target  # noqa: E402
from tilefuse.tile_ir import lower_group  # noqa: E402

CONFIGS = (("cpu", "fp32"), ("cuda:sm_90a", "fp32"), ("cuda:sm_90a", "fp16"))


def emit(program, target_name: str) -> tuple[str, str]:
    """(emitted name, source text) of one program."""
    if target_name == "cpu":
        from tilefuse.codegen.cpu.emit import emit_program

        src = emit_program(program)
        return src.symbol, src.text
    from tilefuse.codegen.cuda.emit import emit_tilelang

    src = emit_tilelang(program)
    return src.func, src.text


def digest_graph(graph, target) -> list[dict]:
    out = []
    partition = partition_graph(graph, target)
    for g in partition.groups:
        if g.kind is FusionKind.OPAQUE:
            for n in g.nodes:
                if isinstance(n.op, Branch):
                    out += [dict(k, branch=which) for which, sub in (("then", n.op.then_graph), ("else", n.op.else_graph))
                            for k in digest_graph(sub, target)]
            continue
        low = lower_group(g, target)
        try:
            name, text = emit(low.program, target.name)
        except Exception as e:  # a refusal is part of the behaviour too
            name, text = "error", f"{type(e).__name__}: {e}"
        out.append({"group": g.id, "program": low.program.name, "kernel": name,
                    "sha256": hashlib.sha256(text.encode()).hexdigest()[:16]})
    return out


def write(path: Path, specs: list[tuple[str, str]], targets: list[str]) -> None:
    result: dict[str, list[dict] | str] = {}
    for name, config in specs:
        onnx_path = models.build(name, config, "float32")
        shapes = models.ZOO[name].shapes(config)
        for target_name, precision in CONFIGS:
            if target_name not in targets:
                continue
            key = f"{name}:{config}/{target_name}/{precision}"
            target = precision_target(get_target(target_name), precision)
            try:
                graph = with_precision(import_onnx(load_model(onnx_path), shapes), precision)
                result[key] = digest_graph(graph, target)
            except Exception as e:
                result[key] = f"{type(e).__name__}: {e}"
            n = len(result[key]) if isinstance(result[key], list) else result[key]
            print(f"{key}: {n}", flush=True)
    path.write_text(json.dumps(result, indent=1, sort_keys=True))


def compare(old: Path, new: Path) -> int:
    a, b = json.loads(old.read_text()), json.loads(new.read_text())
    differ = 0
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            differ += 1
            print(f"differs: {key}")
            ka, kb = a.get(key), b.get(key)
            if isinstance(ka, list) and isinstance(kb, list):
                for x, y in zip(ka, kb):
                    if x != y:
                        print(f"  group {x['group']}: {x['kernel']} -> {y['kernel']}")
                if len(ka) != len(kb):
                    print(f"  {len(ka)} -> {len(kb)} kernels")
            else:
                print(f"  {str(ka)[:200]} -> {str(kb)[:200]}")
    print(f"{len(set(a) | set(b))} model/target/precision entries, {differ} differ")
    return 1 if differ else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("write")
    w.add_argument("file", type=Path)
    w.add_argument("--models", nargs="+", metavar="NAME:CONFIG")
    w.add_argument("--all", action="store_true", help="every zoo model, tiny and real")
    w.add_argument("--targets", nargs="+", default=["cpu", "cuda:sm_90a"])
    c = sub.add_parser("compare")
    c.add_argument("old", type=Path)
    c.add_argument("new", type=Path)
    args = ap.parse_args()
    if args.cmd == "compare":
        return compare(args.old, args.new)
    if args.models:
        specs = [(m.partition(":")[0], m.partition(":")[2] or "tiny") for m in args.models]
    else:
        specs = [(n, c) for n, s in models.ZOO.items() for c in s.configs if args.all or c == "tiny"]
    write(args.file, specs, args.targets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
