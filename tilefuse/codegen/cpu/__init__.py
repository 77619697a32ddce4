"""The CPU code generator: TileProgram -> C -> shared library, through a compile cache.

    artifact = build_kernel(program)          # KernelArtifact (tilefuse.codegen.artifact)
    artifacts = build_all(programs, jobs=4)   # compiles distinct kernels in parallel

Emission (``emit``) is pure and deterministic; ``build`` runs the system C compiler;
``call.call_kernel`` runs a built kernel on numpy arrays (tests, and the runtime).
"""
from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Sequence

from tilefuse.codegen.artifact import KernelArtifact
from tilefuse.codegen.cpu.build import cache_key, compile_cached, find_compiler, library_path
from tilefuse.codegen.cpu.emit import CSource, emit_program
from tilefuse.codegen.options import CpuOptions
from tilefuse.codegen.toolchain import default_cache_dir, entry_ok, sweep_stale
from tilefuse.tile_ir.ir import TileProgram

__all__ = ["CSource", "build_all", "build_kernel", "emit_program"]


def build_kernel(program: TileProgram, cache_dir: Path | None = None,
                 options: CpuOptions = CpuOptions()) -> KernelArtifact:
    """Emit, compile (unless cached) and describe one kernel. Raises CompileError."""
    return build_all([program], jobs=1, cache_dir=cache_dir, options=options)[0]


def build_all(programs: Sequence[TileProgram], jobs: int | None = None,
              cache_dir: Path | None = None, options: CpuOptions = CpuOptions(),
              on_kernel: Callable[[bool], None] | None = None) -> list[KernelArtifact]:
    """One artifact per program, in order. Identical kernels are compiled once; distinct
    ones on ``jobs`` threads (default: one per CPU), each running the C compiler."""
    compiler = find_compiler()
    where = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    where.mkdir(parents=True, exist_ok=True)
    sweep_stale(where)
    sources = [emit_program(p, options) for p in programs]
    isa = options.isa
    with ThreadPoolExecutor(max_workers=max(1, jobs or os.cpu_count() or 1)) as pool:
        futures: dict[str, Future] = {}
        for src in sources:
            key = cache_key(src, compiler, isa)
            if key not in futures:
                cached = entry_ok(library_path(src, compiler, where, isa))
                futures[key] = pool.submit(compile_cached, src, compiler, where, isa)
                if on_kernel is not None:
                    futures[key].add_done_callback(_report(on_kernel, cached))
        built = [futures[cache_key(src, compiler, isa)].result() for src in sources]
    return [
        KernelArtifact(src.symbol, src.symbol, lib, src.params, src.launch, c_file)
        for src, (lib, c_file) in zip(sources, built)
    ]


def _report(on_kernel: Callable[[bool], None], cached: bool) -> Callable[[Future], None]:
    """A done-callback telling ``on_kernel`` that a kernel built (``cached``: it was in the cache)."""
    def done(f: Future) -> None:
        if f.exception() is None:
            on_kernel(cached)
    return done
