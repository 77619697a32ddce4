"""What tilefuse keeps on disk between runs, and clearing it.

Everything lives under one root, ``$TILEFUSE_CACHE`` (default ``~/.cache/tilefuse``):
``kernels/`` (CPU kernel libraries and their C sources), ``kernels/cuda/`` (TileLang
modules, CUDA sources and cubins), ``ort/`` (the onnxruntime libraries built from
``tilefuse/ort/csrc``), ``plans/`` (plans ``tilefuse.InferenceSession`` compiled from
models) and, for the model zoo of a source checkout, ``models/``. Each
entry carries its sha256 and is rebuilt when missing or damaged, so clearing any part
is always safe: the next compile builds what it needs again (minutes for a large CUDA
model). A build running while the cache is cleared rebuilds what it loses.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from tilefuse.codegen.toolchain import default_cache_dir


@dataclass(frozen=True)
class Part:
    name: str
    path: Path
    files: int
    bytes: int


def root() -> Path:
    return default_cache_dir().parent


def parts() -> list[Part]:
    """Each part of the cache with its size (a missing part counts 0)."""
    base = root()
    cpu, cuda = base / "kernels", base / "kernels" / "cuda"
    out = []
    for name, path, skip in (("cpu kernels", cpu, cuda), ("cuda kernels", cuda, None), ("onnxruntime libraries", base / "ort", None),
                             ("plans", base / "plans", None),
                             ("zoo models", base / "models", None)):
        files = size = 0
        for dirpath, dirnames, filenames in os.walk(path):
            if skip is not None and Path(dirpath) == path:
                dirnames[:] = [d for d in dirnames if path / d != skip]
            for f in filenames:
                try:
                    size += os.lstat(os.path.join(dirpath, f)).st_size
                    files += 1
                except OSError:
                    continue
        out.append(Part(name, path, files, size))
    return out


def clear(models: bool = False) -> list[Part]:
    """Remove the compiled kernels and libraries (and the zoo's models with ``models``);
    the parts removed, as they were."""
    removed = []
    for part in parts():
        if part.name == "zoo models" and not models:
            continue
        if part.name == "cuda kernels":  # inside the cpu kernels' folder: removed with it
            removed.append(part)
            continue
        if part.path.exists():
            shutil.rmtree(part.path, ignore_errors=True)
        removed.append(part)
    return removed
