"""Building the onnxruntime libraries from tilefuse's C sources, once, into the cache.

Two libraries come from ``csrc/``: the plugin execution providers, CPU and CUDA (exports only
``CreateEpFactories`` and ``ReleaseEpFactory``) and the custom-op library (exports only
``RegisterCustomOps``). Neither links libonnxruntime: onnxruntime hands them its API table.
They are built with the system C compiler (``$CC``, else ``cc``) on first use and cached
under ``$TILEFUSE_CACHE/ort`` (default ``~/.cache/tilefuse/ort``), keyed by a hash of the
sources, the compiler version and the flags; writes are atomic and every entry's sha256
is recorded beside it and checked before use, as for kernels: a truncated or damaged
library is built again, never handed to onnxruntime.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import threading
from pathlib import Path

from tilefuse.codegen.cpu.build import find_compiler
from tilefuse.codegen.toolchain import commit_entry, compiler_failed, default_cache_dir, entry_ok, sweep_stale
from tilefuse.errors import CompileError

CSRC = Path(__file__).resolve().parent / "csrc"
FLAGS = ("-O2", "-fPIC", "-shared", "-std=gnu11", "-fvisibility=hidden", "-Wall", "-Wextra")
# library -> its C files and defines (each also uses tf_kernel.c and the headers). Both
# carry the CUDA launcher (the provider library also its CUDA provider); they open libcuda
# only when CUDA work comes, so they build and load without CUDA.
LIBRARIES = {"ep": (("tf_ep.c", "tf_ep_cuda.c", "tf_cuda.c"), ("-DTF_WITH_CUDA",)),
             "custom-ops": (("tf_customops.c", "tf_cuda.c"), ("-DTF_WITH_CUDA",))}
COMMON = ("tf_kernel.c", "tf_sha256.c")
HEADERS = ("ort_abi.h", "tf_kernel.h", "cuda_abi.h", "tf_cuda.h", "tf_ep.h")
_lock = threading.Lock()


def cache_dir() -> Path:
    return default_cache_dir().parent / "ort"


def library(kind: str) -> Path:
    """The built library ``kind`` ("ep" or "custom-ops"), compiling it on a cache miss.

    CompileError when there is no C compiler or it fails.
    """
    import tilefuse

    if kind not in LIBRARIES:
        raise ValueError(f"unknown library {kind!r}; known: {sorted(LIBRARIES)}")
    files, defines = LIBRARIES[kind]
    sources = [CSRC / f for f in (*files, *COMMON)]
    compiler = find_compiler()
    flags = (*FLAGS, *defines, f'-DTF_VERSION="{tilefuse.__version__}"')
    h = hashlib.sha256()
    for part in [compiler.version, " ".join(flags)] + [(CSRC / f).read_text() for f in (*files, *COMMON, *HEADERS)]:
        h.update(part.encode())
        h.update(b"\0")
    out = cache_dir() / f"libtilefuse_{kind.replace('-', '')}-{h.hexdigest()[:16]}.so"
    with _lock:
        if entry_ok(out):
            return out
        out.parent.mkdir(parents=True, exist_ok=True)
        sweep_stale(out.parent)
        fd, tmp = tempfile.mkstemp(prefix=f".{out.stem}.", suffix=".so.tmp", dir=out.parent)
        os.close(fd)
        try:
            cmd = [*compiler.command, *flags, "-o", tmp, *map(str, sources), "-ldl", "-lpthread"]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            except subprocess.TimeoutExpired:
                raise CompileError(f"{compiler} took over 300 s building the onnxruntime {kind} library") from None
            if done.returncode != 0:
                raise compiler_failed(f"onnxruntime {kind} library", str(compiler), done.returncode,
                                      done.stderr or done.stdout, sources[0])
            commit_entry(Path(tmp), out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return out
