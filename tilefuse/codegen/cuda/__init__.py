"""The CUDA code generator: TileProgram -> TileLang module -> CUDA C++ -> cubin.

    artifacts = build_all(programs, arch="sm_90a")   # KernelArtifact per program

``emit`` writes the TileLang module (pure), ``tilelang_lower`` lowers it on the host (no
GPU needed) and reads the launch metadata, ``build`` runs nvcc and keeps the cache. The
artifact's ``launch`` is a ``CudaLaunch`` (codegen/launch.py): entry, grid, block,
dynamic shared memory, the kernel's params (device pointers and TMA descriptors, each
naming the TileProgram param it covers) and whether the kernel waits for the previous one
itself (``programmatic``: launched with programmatic stream serialisation).
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

from tilefuse.codegen.artifact import KernelArtifact
from tilefuse.codegen.cuda.build import compile_cubin, headers, lower_cached
from tilefuse.codegen.cuda.emit import TileLangSource, emit_tilelang
from tilefuse.codegen.cuda.tilelang_lower import KernelParam, Lowered
from tilefuse.codegen.launch import CudaLaunch, KernelArg, TensorMap
from tilefuse.codegen.options import CudaOptions
from tilefuse.codegen.toolchain import default_cache_dir, sweep_stale
from tilefuse.device import HOPPER, Device
from tilefuse.tile_ir.ir import TileProgram

__all__ = ["TileLangSource", "build_all", "emit_tilelang"]


def build_all(programs: Sequence[TileProgram], arch: str = "sm_90a", jobs: int | None = None,
              cache_dir: Path | None = None, progress=None, options: CudaOptions = CudaOptions(),
              device: Device = HOPPER) -> list[KernelArtifact]:
    """One artifact per program, in order. Identical kernels build once; TileLang lowers
    one at a time, nvcc runs on ``jobs`` threads. Raises CompileError."""
    where = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "cuda"
    where.mkdir(parents=True, exist_ok=True)
    sweep_stale(where)
    sources = [emit_tilelang(p, options, device) for p in programs]
    lowered: dict[str, tuple] = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs or os.cpu_count() or 1)) as pool:
        cubins = {}
        for src in sources:
            if src.func in lowered:
                continue
            stem, low = lower_cached(src, arch, where)
            lowered[src.func] = (stem, low)
            cubins[src.func] = pool.submit(compile_cubin, stem, arch, src.func, headers(src))
            if progress is not None:
                progress()
        paths = {k: f.result() for k, f in cubins.items()}
    out = []
    for src in sources:
        stem, low = lowered[src.func]
        out.append(KernelArtifact(src.func, low.entry, paths[src.func], src.params, launch_record(low, arch),
                                  stem.with_suffix(".cu")))
    return out


def launch_record(low: Lowered, arch: str) -> CudaLaunch:
    """The launch of a lowered kernel, as the plan and the runtimes read it."""
    return CudaLaunch(low.entry, low.grid, low.block, tuple(_arg(p) for p in low.params),
                      low.dynamic_smem, low.programmatic, arch)


def _arg(p: KernelParam) -> KernelArg:
    if p.kind == "pointer":
        return KernelArg(p.name, p.param)
    t = p.tma
    return KernelArg(p.name, p.param, TensorMap(
        t["dtype"], tuple(t["dims"]), tuple(t["strides"]), tuple(t["box"]), tuple(t["element_strides"]),
        t["interleave"], t["swizzle"], t["l2_promotion"], t["oob_fill"]))
