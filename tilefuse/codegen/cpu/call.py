"""Calling a built CPU kernel on numpy arrays through ctypes (tests; the runtime may reuse it).

Arrays must match the kernel's params exactly: dtype, shape, C-contiguous. Outputs are
written in place; the status word of a kernel that checks indices is passed apart. ctypes releases the GIL for the call, so threads run kernels in parallel.
"""
from __future__ import annotations

import ctypes
import threading
from _ctypes import CFuncPtr
from pathlib import Path
from typing import Sequence

import numpy as np

from tilefuse.codegen.artifact import KernelArtifact
from tilefuse.errors import ExecutionError
from tilefuse.ir.dtypes import DType

_lock = threading.Lock()
_loaded: dict[tuple[Path, str], CFuncPtr] = {}


def load_kernel(artifact: KernelArtifact) -> CFuncPtr:
    """The kernel's C function (libraries are loaded once per process)."""
    key = (Path(artifact.path), artifact.symbol)
    with _lock:
        fn = _loaded.get(key)
        if fn is None:
            lib = ctypes.CDLL(str(artifact.path), mode=ctypes.RTLD_LOCAL)
            fn = lib[artifact.symbol]
            fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
            fn.restype = None
            _loaded[key] = fn
    return fn


def call_kernel(artifact: KernelArtifact, arrays: Sequence[np.ndarray], status: np.ndarray | None = None) -> None:
    """Run the kernel with ``arrays`` as its params, in order (inputs, then outputs).

    A kernel that checks indices also gets a status word: ``status`` (int64[2], zeroed by
    the caller) receives what it reports; without one a reported index is an
    ExecutionError."""
    specs = [p for p in artifact.params if p.role != "status"]
    checked = len(specs) != len(artifact.params)
    if len(arrays) != len(specs):
        raise ValueError(f"{artifact.name}: {len(specs)} params, got {len(arrays)} arrays")
    for p, a in zip(specs, arrays):
        want = DType(p.dtype).numpy
        if a.dtype != want or a.shape != tuple(p.shape) or not a.flags.c_contiguous:
            raise ValueError(f"{artifact.name}: param {p.name} is {want}{list(p.shape)} (C-contiguous), "
                             f"got {a.dtype}{list(a.shape)}{'' if a.flags.c_contiguous else ' (strided)'}")
        if p.role == "output" and not a.flags.writeable:
            raise ValueError(f"{artifact.name}: output {p.name} is read-only")
    word = np.zeros(2, np.int64) if status is None else status
    if word.dtype != np.int64 or word.shape != (2,) or not word.flags.c_contiguous:
        raise ValueError(f"{artifact.name}: the status word is int64[2], got {word.dtype}{list(word.shape)}")
    ptrs = [a.ctypes.data for a in arrays] + ([word.ctypes.data] if checked else [])
    load_kernel(artifact)((ctypes.c_void_p * len(ptrs))(*ptrs))
    if status is None and word[0]:
        raise ExecutionError(f"{artifact.name}: index check {word[0] - 1} found index {word[1]} out of range")
