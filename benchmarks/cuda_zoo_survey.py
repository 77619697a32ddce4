"""Compile zoo models for cuda:sm_90a kernel by kernel (no GPU needed) and say what came out.

    [TILEFUSE_CACHE=EMPTY_DIR] python benchmarks/cuda_zoo_survey.py [--models yolo crnn ...]
                                   [--config tiny] [--dtype float32] [--json FILE]

Each kernel group is lowered, emitted and built on its own, so one failure does not hide
the next: per model, how many kernels built, the seconds it took (emission, TileLang's
host lowering and nvcc; point ``TILEFUSE_CACHE`` at an empty folder for cold numbers), the largest
cubin, every kernel that failed (its error's first lines and where its generated source
is) and every kernel launched as one thread of one block whose output has more than 8
elements (the same rule as tests/tile_ir/test_patterns_zoo.py). Then the whole model goes
through ``tilefuse.compile`` (the kernels now cached) to check that the plan links.
Exit status 1 if any kernel or plan failed. Defaults: the zoo's later families.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

LATER_FAMILIES = ["yolo", "convnext", "efficientnet", "crnn", "whisper-encoder", "sbert"]


def survey(name: str, config: str, dtype: str) -> dict:
    import models
    from tilefuse.codegen.cuda import build_all, emit_tilelang
    from tilefuse.codegen.cuda.build import cache_key
    from tilefuse.codegen.toolchain import default_cache_dir
    from tilefuse.compiler import compile_model
    from tilefuse.frontend import import_onnx
    from tilefuse.partition import partition_graph
    from tilefuse.target import CUDA_SM90A
    from tilefuse.tile_ir.lower import lower_group

    shapes = models.ZOO[name].shapes(config)
    path = models.build(name, config, dtype)
    row: dict = {"model": f"{name}-{config}-{dtype}", "kernels": 0, "failures": [], "one_thread": []}
    start = time.perf_counter()
    graph = import_onnx(path, shapes)
    groups = [g for g in partition_graph(graph, CUDA_SM90A).groups if str(g.kind) != "opaque"]
    largest = (0, "")
    where = default_cache_dir() / "cuda"
    for g in groups:
        stage, stem = "lower", None
        try:
            program = lower_group(g, CUDA_SM90A).program
            stage = "emit"
            source = emit_tilelang(program)
            stem = where / f"{source.func}-{cache_key(source, 'sm_90a')[:16]}"
            stage = "build"
            (art,) = build_all([program], arch="sm_90a")
        except Exception as e:  # record every failure, then go on
            files = [str(p) for p in (stem.with_suffix(".py"), stem.with_suffix(".cu")) if p.exists()] if stem else []
            row["failures"].append({"group": g.name, "stage": stage, "files": files,
                                    "error": f"{type(e).__name__}: {str(e)[:1500]}"})
            continue
        row["kernels"] += 1
        size = art.path.stat().st_size
        largest = max(largest, (size, art.name))
        out = sum(math.prod(b.shape) for b in program.outputs)
        lanes = math.prod(art.launch.grid) * math.prod(art.launch.block)
        if lanes == 1 and out > 8:
            row["one_thread"].append({"group": g.name, "kernel": art.name, "family": program.schedule.family,
                                      "outputs": out, "source": str(art.source)})
    row["groups"] = len(groups)
    row["kernel_seconds"] = round(time.perf_counter() - start, 1)
    row["largest_cubin"] = {"bytes": largest[0], "kernel": largest[1]}
    if not row["failures"]:
        start = time.perf_counter()
        try:
            compiled = compile_model(path, "cuda:sm_90a", shapes)
            row["plan"] = {"kernels": len(compiled.plan.kernels), "steps": len(compiled.plan.steps),
                           "seconds_cached": round(time.perf_counter() - start, 1)}
        except Exception as e:
            row["plan"] = {"error": f"{type(e).__name__}: {str(e)[:1500]}"}
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=LATER_FAMILIES)
    ap.add_argument("--config", default="tiny")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = ap.parse_args()
    rows, failed = [], 0
    for name in args.models:
        row = survey(name, args.config, args.dtype)
        rows.append(row)
        bad = bool(row["failures"]) or "error" in row.get("plan", {})
        failed += bad
        cubin = row["largest_cubin"]
        print(f"{row['model']:34s} {row['kernels']}/{row['groups']} kernels in {row['kernel_seconds']} s, "
              f"largest cubin {cubin['bytes'] / 1024:.0f} KiB ({cubin['kernel']}), "
              f"{len(row['one_thread'])} one-thread, {len(row['failures'])} failed"
              + (f"; plan: {row['plan']}" if "plan" in row else ""), flush=True)
        for f in row["failures"]:
            print(f"    FAILED {f['group']} ({f['stage']}): {f['error'][:600]}\n      files: {f['files']}")
        for t in row["one_thread"]:
            print(f"    one thread: {t['group']} {t['kernel']} ({t['family']}) for {t['outputs']} outputs")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
