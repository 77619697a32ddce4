"""How many threads a CPU plan's parallel kernels use: set per run, on the calling thread.

Kernels run their parallel loops on tilefuse's own thread pool (codegen/cpu/threads.py),
carried by every kernel library and shared by all of them in the process. Its team size is
kept per OS thread, so the executor sets it on the calling thread before every run: each
session keeps its own count whichever thread runs it, and whatever ``OMP_NUM_THREADS`` says.
Kernels built before the pool (or by a compiler whose OpenMP calls the pool does not stand in
for: clang's) link an OpenMP runtime instead; for them the count goes through
``omp_set_num_threads``, which libgomp and libomp also keep per thread.
"""
from __future__ import annotations

import _ctypes
import ctypes
import threading
from typing import Iterable

from tilefuse.errors import InputError
from tilefuse.runtime.native import NativeLibrary


class Team:
    """The thread count of a plan's parallel kernels.

    ``threads``: the count they run with, at most: the one asked for, or (None or 0) the
    process default, ``OMP_NUM_THREADS`` else one per core the process may run on; 1 when
    no kernel has a parallel loop. ``pool``: what runs them ("tilefuse", "openmp", "none").
    """

    def __init__(self, libs: Iterable[NativeLibrary], threads: int | None) -> None:
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 0):
            raise InputError(f"threads must be a non-negative integer (0: the default), got {threads!r}")
        self._set: _ctypes.CFuncPtr | None = None
        self.pool, self.threads = "none", 1
        for lib in libs:
            own = lib.function("tf_threads_set", required=False)
            if own is not None:  # a kernel with a parallel loop carries the pool
                self._bind(own, "tilefuse")
                default, cap = lib.function("tf_threads_default"), lib.function("tf_threads_cap")
                self.threads = min(threads or default(), cap())
                return
            # found through the library's dependencies (the OpenMP runtime it links)
            omp_set = lib.dependency_function("omp_set_num_threads")
            if omp_set is not None:
                self._bind(omp_set, "openmp")
                limit, most = lib.dependency_function("omp_get_thread_limit"), lib.dependency_function("omp_get_max_threads")
                assert limit is not None and most is not None, "an OpenMP runtime without omp_get_thread_limit"
                self.threads = max(1, min(threads or _on_fresh_thread(most), limit()))
                return

    def _bind(self, setter: _ctypes.CFuncPtr, pool: str) -> None:
        setter.argtypes, setter.restype = [ctypes.c_int], None
        self._set, self.pool = setter, pool

    def apply(self) -> None:
        """Make the calling thread's next parallel regions use ``threads`` threads."""
        if self._set is not None:
            self._set(self.threads)


def _on_fresh_thread(fn: _ctypes.CFuncPtr) -> int:
    """``fn()`` on a new thread: the OpenMP runtime's process-wide default, which no
    thread's own ``omp_set_num_threads`` has changed."""
    out: list[int] = []
    t = threading.Thread(target=lambda: out.append(fn()), name="tilefuse-omp-default")
    t.start()
    t.join()
    return out[0]
