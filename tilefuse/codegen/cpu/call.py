"""Calling a built CPU kernel on numpy arrays through ctypes (tests; the runtime may reuse it).

Arrays must match the kernel's params exactly: dtype, shape, C-contiguous. Outputs are
written in place. ctypes releases the GIL for the call, so threads run kernels in parallel.
"""
from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from tilefuse.codegen.artifact import KernelArtifact
from tilefuse.ir.dtypes import DType

_lock = threading.Lock()
_loaded: dict[tuple[Path, str], Callable] = {}


def load_kernel(artifact: KernelArtifact) -> Callable:
    """The kernel's C function (libraries are loaded once per process)."""
    key = (Path(artifact.path), artifact.symbol)
    with _lock:
        fn = _loaded.get(key)
        if fn is None:
            lib = ctypes.CDLL(str(artifact.path), mode=ctypes.RTLD_LOCAL)
            fn = getattr(lib, artifact.symbol)
            fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
            fn.restype = None
            _loaded[key] = fn
    return fn


def call_kernel(artifact: KernelArtifact, arrays: Sequence[np.ndarray]) -> None:
    """Run the kernel with ``arrays`` as its params, in order (inputs, then outputs)."""
    if len(arrays) != len(artifact.params):
        raise ValueError(f"{artifact.name}: {len(artifact.params)} params, got {len(arrays)} arrays")
    for p, a in zip(artifact.params, arrays):
        want = DType(p.dtype).numpy
        if a.dtype != want or a.shape != tuple(p.shape) or not a.flags.c_contiguous:
            raise ValueError(f"{artifact.name}: param {p.name} is {want}{list(p.shape)} (C-contiguous), "
                             f"got {a.dtype}{list(a.shape)}{'' if a.flags.c_contiguous else ' (strided)'}")
        if p.role == "output" and not a.flags.writeable:
            raise ValueError(f"{artifact.name}: output {p.name} is read-only")
    argv = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    load_kernel(artifact)(argv)
