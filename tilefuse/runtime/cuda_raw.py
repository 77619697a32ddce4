"""The driver calls of a steady run (``runtime/cuda_steady.py``) made straight through ctypes.

A waited ``run()`` on the same tensors as the run before launches the plan's graph and
waits: a handful of driver calls around a Python check of the feeds. Through cuda-bindings
each call builds its handle objects, a result tuple and a ``CUresult`` enum member, and the
caller compares that member: on the H200 the calls before the launch and the work after the
wait were about 4 of the 12-13 us a waited bert-base ``run()`` added to its graph
(benchmarks/gpu_wait_probe.py). Here the same entry points of the same driver library
(``libcuda.so.1``, which cuda-bindings has loaded already) take plain integers and return
the ``CUresult`` as an int, 0 for success; the context is made current only where it is
not (torch and tilefuse share the device's primary context, and a thread that ran torch
has it current already).

Only the steady run uses it; everything else (loading, capturing, errors' names) goes
through cuda-bindings. Where the library cannot be loaded or lacks an entry point,
``load`` gives None and the steady run makes its calls through cuda-bindings as before.
"""
from __future__ import annotations

import ctypes
from typing import Protocol


class RawCalls(Protocol):
    """What a steady run calls: handles as ints, each call's CUresult as an int."""

    def handle(self, h: object) -> int: ...
    def ensure_current(self, ctx: int) -> int: ...
    def order(self, event: int, caller: int, stream: int) -> int: ...
    def launch(self, graph: int, stream: int) -> int: ...
    def synchronize(self, stream: int) -> int: ...


class RawDriver:
    """``cuCtxGetCurrent``/``cuCtxSetCurrent``, ``cuEventRecord``/``cuStreamWaitEvent``,
    ``cuGraphLaunch`` and ``cuStreamSynchronize`` of ``lib`` (the CUDA driver library, or a
    stand-in with its C interface) through ctypes."""

    ENTRY_POINTS = ("cuCtxGetCurrent", "cuCtxSetCurrent", "cuEventRecord", "cuStreamWaitEvent", "cuGraphLaunch",
                    "cuStreamSynchronize")

    def __init__(self, lib: ctypes.CDLL) -> None:
        p, i = ctypes.c_void_p, ctypes.c_int
        signatures = {"cuCtxGetCurrent": [ctypes.POINTER(p)], "cuCtxSetCurrent": [p], "cuEventRecord": [p, p],
                      "cuStreamWaitEvent": [p, p, ctypes.c_uint], "cuGraphLaunch": [p, p], "cuStreamSynchronize": [p]}
        for name, args in signatures.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, i
        self._get, self._set = lib.cuCtxGetCurrent, lib.cuCtxSetCurrent
        self._record, self._wait = lib.cuEventRecord, lib.cuStreamWaitEvent
        self._launch, self._sync = lib.cuGraphLaunch, lib.cuStreamSynchronize
        self._current = ctypes.c_void_p()
        self._current_ref = ctypes.byref(self._current)

    @classmethod
    def load(cls, name: str = "libcuda.so.1") -> RawDriver | None:
        """The driver library's calls, or None where it cannot be loaded or lacks one."""
        try:
            lib = ctypes.CDLL(name)
            return cls(lib)
        except (OSError, AttributeError):
            return None

    def handle(self, h: object) -> int:
        """A cuda-bindings handle's value (its pointer: ``int()`` of the object)."""
        return int(h)  # type: ignore[call-overload]

    def ensure_current(self, ctx: int) -> int:
        """Make ``ctx`` this thread's current context unless it is already."""
        err = self._get(self._current_ref)
        if err or self._current.value == ctx:
            return err
        return self._set(ctx)

    def order(self, event: int, caller: int, stream: int) -> int:
        """``stream``'s later work after ``caller``'s work queued so far (``event`` between)."""
        return self._record(event, caller) or self._wait(stream, event, 0)

    def launch(self, graph: int, stream: int) -> int:
        return self._launch(graph, stream)

    def synchronize(self, stream: int) -> int:
        return self._sync(stream)
