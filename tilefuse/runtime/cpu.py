"""Running a plan on the CPU: kernels from shared libraries through ctypes.

Each kernel library is loaded once; each kernel has the ABI ``void SYMBOL(void **args)``
(see tilefuse.codegen.artifact). Weights are copied once into 64-byte aligned memory.
Every run takes an arena from a pool, so concurrent runs never share intermediates;
ctypes releases the GIL while a kernel runs, so threads really run in parallel.

An arena carries what depends only on its address: a numpy view per arena buffer, its own
copy of each input, and per kernel step the argument array with every pointer filled in.
A run copies the feeds in, then calls each run of consecutive kernel steps through the
step driver every kernel library carries (one ctypes call for the run, not one per step).

The runtime does not read a kernel's ``launch`` data: a CPU kernel parallelises itself
(OpenMP loops, run on tilefuse's pool). How many threads they use is the session's
``threads``, set on the calling thread before every run (threads.py).
"""
from __future__ import annotations

import ctypes
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from tilefuse.errors import ExecutionError, PlanError
from tilefuse.plan.model import BufferKind, HostStep, Kernel, KernelStep, Plan
from tilefuse.runtime.pool import ArenaPool, aligned_empty
from tilefuse.runtime.threads import Team

KernelFn = Callable[[ctypes.Array], None]
# tf_run_steps(n, fns, argvs): every kernel library carries it (codegen/cpu/prelude.py)
DRIVER_SYMBOL = "tf_run_steps"


@dataclass(slots=True)
class _Batch:
    """Consecutive kernel steps, called in one go: through the driver when there is one."""

    first: int  # index of the first step
    kernels: list[KernelFn]
    fns: ctypes.Array  # function pointers, for the driver
    argvs: ctypes.Array  # per step, its argument array


@dataclass(slots=True)
class _Arena:
    memory: np.ndarray  # keeps the bytes alive
    views: dict[int, np.ndarray]  # buffer id -> typed view: arena buffers and input copies
    inputs: list[tuple[str, np.ndarray]]  # feed name -> this arena's copy of it
    outputs: dict[str, np.ndarray]  # output name -> the array it is read from
    args: list[ctypes.Array | None]  # per step: the kernel's argument array (None: host step)
    batches: list[_Batch | int]  # in order: a batch of kernel steps, or a host step's index


class CpuExecutor:
    """Executes a cpu plan; ``run`` is safe to call from several threads at once.

    ``threads``: the thread count of its parallel kernels (None or 0: the default); the
    attribute of the same name is the count they run with, and ``thread_pool`` what runs
    them (see ``threads.Team``).
    """

    threaded = True

    def __init__(self, plan: Plan, threads: int | None = None) -> None:
        self.plan = plan
        libs = {name: _load_library(k) for name, k in plan.kernels.items()}
        self._team = Team(libs.values(), threads)
        self.threads, self.thread_pool = self._team.threads, self._team.pool
        self._fns = {name: _kernel_fn(libs[name], k) for name, k in plan.kernels.items()}
        self._driver = _find_driver(libs.values())
        self._fixed: dict[int, np.ndarray] = {}  # constant buffers: aligned copies of the weights
        for buf in plan.buffers:
            if buf.kind is BufferKind.CONSTANT:
                self._fixed[buf.id] = _aligned_like(plan.weights[buf.name])
        self._inputs = {b.name: b.buffer for b in plan.inputs}
        self._outputs = {b.name: b.buffer for b in plan.outputs}
        self._pool: ArenaPool[_Arena] = ArenaPool(self._new_arena)

    def _new_arena(self) -> _Arena:
        """Memory for one run in flight, with every kernel argument array filled in.

        Feeds are copied into the arena's own input buffers at the start of a run (a
        copy costs less than looking up a numpy array's address through ctypes), so
        nothing in an argument array changes between runs.
        """
        memory = aligned_empty(self.plan.arena_bytes)
        views: dict[int, np.ndarray] = {}
        for buf in self.plan.buffers:
            if buf.kind.in_arena:
                assert buf.offset is not None
                raw = memory[buf.offset : buf.offset + buf.nbytes]
                views[buf.id] = raw.view(buf.type.dtype.numpy).reshape(buf.type.shape)
            elif buf.kind is BufferKind.INPUT:
                views[buf.id] = aligned_empty(buf.nbytes).view(buf.type.dtype.numpy).reshape(buf.type.shape)
        args: list[ctypes.Array | None] = []
        for step in self.plan.steps:
            if isinstance(step, KernelStep):
                ids = step.inputs + step.outputs
                ptrs = [(views[b] if b in views else self._fixed[b]).ctypes.data for b in ids]
                args.append((ctypes.c_void_p * len(ids))(*ptrs))
            else:
                args.append(None)
        inputs = [(name, views[b]) for name, b in self._inputs.items()]
        outputs = {name: views[b] if b in views else self._fixed[b] for name, b in self._outputs.items()}
        return _Arena(memory, views, inputs, outputs, args, self._batches(args))

    def _batches(self, args: list[ctypes.Array | None]) -> list[_Batch | int]:
        out: list[_Batch | int] = []
        run: list[int] = []

        def close() -> None:
            if run:
                kernels = [self._fns[self.plan.steps[i].kernel] for i in run]  # type: ignore[union-attr]
                fns = (ctypes.c_void_p * len(run))(*[ctypes.cast(k, ctypes.c_void_p).value for k in kernels])
                argvs = (ctypes.c_void_p * len(run))(*[ctypes.addressof(args[i]) for i in run])  # type: ignore[arg-type]
                out.append(_Batch(run[0], kernels, fns, argvs))
                run.clear()

        for i, step in enumerate(self.plan.steps):
            if isinstance(step, KernelStep):
                run.append(i)
            else:
                close()
                out.append(i)
        close()
        return out

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str]) -> list[np.ndarray]:
        """Run every step; ``feeds`` are already checked (names, dtypes, shapes).

        Returns fresh arrays for ``outputs`` (names of plan outputs), never arena views.
        """
        arena = self._pool.get()
        try:
            self._team.apply()  # per run: the count is per OS thread, and others may set it
            for name, dst in arena.inputs:
                np.copyto(dst, feeds[name], casting="no")
            driver = self._driver
            for batch in arena.batches:
                if isinstance(batch, int):
                    self._host(self.plan.steps[batch], arena)  # type: ignore[arg-type]
                elif driver is not None:
                    driver(len(batch.kernels), batch.fns, batch.argvs)
                else:
                    for j, kernel in enumerate(batch.kernels):
                        kernel(arena.args[batch.first + j])  # type: ignore[arg-type]
            return [arena.outputs[n].copy() for n in outputs]
        finally:
            self._pool.put(arena)

    def _array(self, b: int, arena: _Arena) -> np.ndarray:
        return arena.views[b] if b in arena.views else self._fixed[b]

    def _host(self, step: HostStep, arena: _Arena) -> None:
        args = [self._array(b, arena) for b in step.inputs]
        results = step.primitive.evaluate(args)
        for b, r in zip(step.outputs, results, strict=True):
            out = arena.views[b]
            if r.shape != out.shape or r.dtype != out.dtype:
                raise ExecutionError(f"{step.label} returned {r.dtype}{list(r.shape)}, expected {out.dtype}{list(out.shape)}")
            np.copyto(out, r)


def _find_driver(libs: Iterable[ctypes.CDLL]) -> Callable | None:
    """The step driver from the first kernel library that has it (older plans: none)."""
    for lib in libs:
        fn = getattr(lib, DRIVER_SYMBOL, None)
        if fn is not None:
            fn.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
            fn.restype = None
            return fn
    return None


def _load_library(kernel: Kernel) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(_loadable_path(kernel), mode=ctypes.RTLD_LOCAL)
    except OSError as e:
        raise PlanError(f"{kernel.path}: cannot load kernel {kernel.name}: {e}") from None


def _kernel_fn(lib: ctypes.CDLL, kernel: Kernel) -> KernelFn:
    try:
        fn = getattr(lib, kernel.symbol)
    except AttributeError:
        raise PlanError(f"{kernel.path}: no symbol {kernel.symbol!r} (kernel {kernel.name})") from None
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
    fn.restype = None
    return fn


# dlopen returns the library already loaded under the same path, even if the file has
# been replaced since (a plan saved again to the same place). Remember what each path
# held when loaded, and load changed contents from a private copy instead.
_LOADED: dict[str, str] = {}
_LOADED_LOCK = threading.Lock()


def _loadable_path(kernel: Kernel) -> str:
    path = str(kernel.path.resolve())
    with _LOADED_LOCK:
        if _LOADED.setdefault(path, kernel.sha256) == kernel.sha256:
            return path
        copy = Path(tempfile.mkdtemp(prefix="tilefuse-")) / f"{kernel.sha256[:16]}{kernel.suffix}"
        shutil.copyfile(kernel.path, copy)
        return str(copy)


def _aligned_like(w: np.ndarray) -> np.ndarray:
    out = aligned_empty(w.nbytes).view(w.dtype).reshape(w.shape)
    np.copyto(out, w)
    out.setflags(write=False)  # weights are shared by every run
    return out
