"""nvcc and the CUDA kernel cache.

A kernel is built once per (TileLang module text, TileLang version, nvcc version, flags,
arch, tilefuse's device-function headers, which nvcc includes ahead of the kernel: the
math header always, the index check's where the kernel checks indices):
``$TILEFUSE_CACHE/kernels/cuda`` holds ``FUNC-KEY.py`` (the TileLang module), ``.cu``
(what TileLang generated), ``.cubin`` and ``.json`` (launch metadata), the last three
each with its sha256 beside it: an entry that does not match is built again, never used.
Files are written under temporary names and renamed into place, as for the CPU cache.

nvcc is ``$NVCC`` if set, else ``nvcc`` on PATH, else ``/usr/local/cuda/bin/nvcc``.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import asdict
from pathlib import Path

from tilefuse.codegen.cuda.emit import TileLangSource
from tilefuse.codegen.cuda.fast_math import HEADER
from tilefuse.codegen.cuda.tilelang_lower import DEFAULT_PASS_CONFIG, KernelParam, Lowered, lower_module, tilelang_version
from tilefuse.codegen.toolchain import commit_entry, compiler_failed, ensure_text, entry_ok, read_entry, store_entry
from tilefuse.errors import CompileError

NVCC_FLAGS = ("--cubin", "-O3", "-lineinfo", "-std=c++20", "-w")
COMPILE_TIMEOUT_S = 900
MAX_SHARED = {"sm_90a": 227 * 1024, "sm_90": 227 * 1024}  # opt-in shared memory per block


@functools.lru_cache(maxsize=1)
def find_nvcc() -> tuple[str, str]:
    """(path, version text) of nvcc; CompileError if there is none."""
    spec = os.environ.get("NVCC", "").strip()
    path = spec or shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else "")
    if not path or not (os.path.exists(path) or shutil.which(path)):
        raise CompileError("the CUDA target needs nvcc: none on PATH or in /usr/local/cuda/bin; install the CUDA "
                           "toolkit (or the nvidia-cuda-nvcc wheel) or set $NVCC")
    done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise CompileError(f"nvcc ({path}) does not run: {done.stderr.strip()[:500]}")
    return path, done.stdout.strip()


def include_dirs() -> list[str]:
    from tilelang.env import CUTLASS_INCLUDE_DIR, TILELANG_TEMPLATE_PATH  # the headers kernels include

    return [TILELANG_TEMPLATE_PATH, CUTLASS_INCLUDE_DIR]


def arch_flags(arch: str) -> list[str]:
    num = arch.removeprefix("sm_")
    return [f"-gencode=arch=compute_{num},code=sm_{num}"]


INDEX_HEADER = HEADER.parent / "tilefuse_index.cuh"  # tf_index, for kernels with index checks


def headers(source: TileLangSource) -> tuple[Path, ...]:
    """The device-function headers nvcc includes ahead of this kernel."""
    return (HEADER, INDEX_HEADER) if source.checks_indices else (HEADER,)


@functools.cache
def _text(path: Path) -> str:
    return path.read_text()


def cache_key(source: TileLangSource, arch: str) -> str:
    _, nvcc_version = find_nvcc()
    h = hashlib.sha256()
    for part in (source.text, tilelang_version(), repr(sorted(DEFAULT_PASS_CONFIG.items())), nvcc_version, " ".join(NVCC_FLAGS), arch,
                 *map(_text, headers(source))):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def lower_cached(source: TileLangSource, arch: str, cache_dir: Path) -> tuple[Path, Lowered]:
    """TileLang lowering (serial: TileLang is not thread-safe); returns the stem of the
    cache files and the lowered kernel, reading the cache when it has it."""
    stem = cache_dir / f"{source.func}-{cache_key(source, arch)[:16]}"
    cached = _cached_lowering(stem)
    if cached is not None:
        return stem, cached
    module = stem.with_suffix(".py")
    ensure_text(module, source.text.encode())
    lowered = lower_module(module, source.func, arch, source.func)
    limit = MAX_SHARED.get(arch)
    if limit is not None and lowered.dynamic_smem > limit:
        raise CompileError(f"kernel {source.func}: needs {lowered.dynamic_smem} bytes of shared memory per block, "
                           f"{arch} allows {limit}; its TileLang module is {module}")
    store_entry(stem.with_suffix(".cu"), lowered.source.encode())
    data = asdict(lowered)
    data.pop("source")
    store_entry(stem.with_suffix(".json"), json.dumps(data, indent=1).encode())
    return stem, lowered


def _cached_lowering(stem: Path) -> Lowered | None:
    """The cached lowering if its source and metadata both match their digests."""
    meta, source = read_entry(stem.with_suffix(".json")), read_entry(stem.with_suffix(".cu"))
    if meta is None or source is None:
        return None
    try:
        return _read_meta(json.loads(meta), source.decode())
    except (ValueError, KeyError, TypeError):  # a digest of other metadata (an older tilefuse's)
        return None


def compile_cubin(stem: Path, arch: str, kernel: str, include: tuple[Path, ...] = (HEADER,)) -> Path:
    cubin = stem.with_suffix(".cubin")
    if entry_ok(cubin):
        return cubin
    nvcc, _ = find_nvcc()
    cu = stem.with_suffix(".cu")
    fd, tmp = tempfile.mkstemp(prefix=f".{stem.name}.", suffix=".cubin.tmp", dir=stem.parent)
    os.close(fd)
    try:
        cmd = [nvcc, *NVCC_FLAGS, *arch_flags(arch), *(f"-I{d}" for d in include_dirs()),
               *(x for h in include for x in ("-include", str(h))),
               "-o", tmp, str(cu)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise CompileError(f"kernel {kernel}: nvcc took over {COMPILE_TIMEOUT_S} s on {cu}") from None
        if done.returncode != 0:
            raise compiler_failed(kernel, "nvcc", done.returncode, done.stderr or done.stdout, cu)
        commit_entry(Path(tmp), cubin)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return cubin


def _read_meta(d: dict, source: str) -> Lowered:
    params = tuple(KernelParam(**p) for p in d["params"])
    return Lowered(source, d["entry"], tuple(d["grid"]), tuple(d["block"]), d["dynamic_smem"], params,
                   bool(d.get("programmatic", False)))
