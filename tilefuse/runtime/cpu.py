"""Running a plan on the CPU: kernels from shared libraries through ctypes.

Each kernel library is loaded once per executor, from the bytes whose hash the plan
records (``native.NativeLibrary``), and unloaded by ``close``; each kernel has the ABI
``void SYMBOL(void **args)`` (see tilefuse.codegen.artifact), its symbol the one its name
gives and defined by its own library. Weights are copied once into 64-byte aligned memory.
Every run takes an arena from a pool, so concurrent runs never share intermediates;
ctypes releases the GIL while a kernel runs, so threads really run in parallel.

An arena carries what depends only on its address: a numpy view per arena buffer, its own
copy of each input, and per kernel step the argument array with every pointer filled in.
A run copies the feeds in, then calls each run of consecutive kernel steps through the
step driver every kernel library carries (one ctypes call for the run, not one per step).
A branch (an If on a run-time condition) reads its condition from its buffer and runs the
steps of the branch taken; a select step copies that branch's results to the If's outputs.

The runtime does not read a kernel's ``launch`` data: a CPU kernel parallelises itself
(OpenMP loops, run on tilefuse's pool). How many threads they use is the session's
``threads``, set on the calling thread before every run (threads.py).

A profile's run (``step_times``) calls each step on its own with a CPU timer around it;
``run``'s loop has no timer.

Kernels that check indices read at run time get a status word each, in the arena's
``status`` rows (zero; a kernel writes its row only when it finds an index out of
range). A run looks at them once, at its end, and raises the first one's error.
"""
from __future__ import annotations

import _ctypes
import ctypes
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Sequence, Union

import numpy as np

from tilefuse.errors import ExecutionError
from tilefuse.plan.files import read_verified
from tilefuse.plan.model import BranchStep, BufferKind, HostStep, Kernel, KernelStep, Plan, SelectStep, step_order
from tilefuse.plan.verify import check_kernel_identity
from tilefuse.cpu_isa import check_host
from tilefuse.runtime.native import NativeLibrary
from tilefuse.runtime.pool import ArenaPool, aligned_empty
from tilefuse.runtime.threads import Team

KernelFn = _ctypes.CFuncPtr  # void SYMBOL(void **args), called with the step's argument array
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
class _Fork:
    """A BranchStep: the blocks of its two branches."""

    step: int
    then_block: list["_Item"]
    else_block: list["_Item"]


_Item = Union[_Batch, int, _Fork]  # a batch of kernel steps, a host or select step's index, a branch


@dataclass(slots=True)
class _Arena:
    memory: np.ndarray  # keeps the bytes alive
    views: dict[int, np.ndarray]  # buffer id -> typed view: arena buffers and input copies
    inputs: list[tuple[str, np.ndarray]]  # feed name -> this arena's copy of it
    outputs: dict[str, np.ndarray]  # output name -> the array it is read from
    args: dict[int, ctypes.Array]  # kernel step index -> its argument array
    block: list[_Item]  # the plan's steps, in order
    status: np.ndarray  # [plan.checked_steps(), 2] int64: each checking kernel's status word


class CpuExecutor:
    """Executes a cpu plan; ``run`` is safe to call from several threads at once, and
    ``close`` (once no run is in flight) unloads its libraries and drops its memory.

    ``threads``: the thread count of its parallel kernels (None or 0: the default); the
    attribute of the same name is the count they run with, and ``thread_pool`` what runs
    them (see ``threads.Team``).
    """

    threaded = True

    def __init__(self, plan: Plan, threads: int | None = None) -> None:
        self.plan = plan
        check_host(plan)  # the CPU extensions its kernels may use, before any is loaded
        self._libs: list[NativeLibrary] = []
        try:
            self._fns = {name: self._load(k) for name, k in plan.kernels.items()}
            self._team = Team(self._libs, threads)
        except BaseException:
            self.close()
            raise
        self.threads, self.thread_pool = self._team.threads, self._team.pool
        self._driver = _find_driver(self._libs)
        self._fixed: dict[int, np.ndarray] = {}  # constant buffers: aligned copies of the weights
        for buf in plan.buffers:
            if buf.kind is BufferKind.CONSTANT:
                self._fixed[buf.id] = _aligned_like(plan.weights[buf.name])
        self._inputs = {b.name: b.buffer for b in plan.inputs}
        self._outputs = {b.name: b.buffer for b in plan.outputs}
        self._checked = plan.checked_steps()
        self._pool: ArenaPool[_Arena] = ArenaPool(self._new_arena)

    def _load(self, kernel: Kernel) -> KernelFn:
        """The kernel's function, from a library loaded from its verified bytes."""
        check_kernel_identity(kernel, self.plan.target)  # a plan built in memory is checked here
        lib = NativeLibrary(read_verified(kernel.path, kernel.sha256, f"kernel {kernel.name}"), str(kernel.path))
        self._libs.append(lib)
        fn = lib.function(kernel.symbol)
        fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        fn.restype = None
        return fn

    def close(self) -> None:
        """Unload every kernel library and drop the arenas and weights (idempotent). No
        run may be in flight: ``InferenceSession.close`` waits for them."""
        self._fns, self._driver = {}, None
        self._pool = ArenaPool(self._no_arena)
        self._fixed = {}
        libs, self._libs = self._libs, []
        for lib in libs:
            lib.close()

    def _no_arena(self) -> _Arena:
        raise ExecutionError("this CPU executor is closed: its kernel libraries are unloaded")

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
        status = np.zeros((len(self._checked), 2), np.int64)
        slot = {step: k for k, step in enumerate(self._checked)}
        args: dict[int, ctypes.Array] = {}
        for i, step in enumerate(self.plan.steps):
            if isinstance(step, KernelStep):
                ids = step.inputs + step.outputs
                ptrs = [(views[b] if b in views else self._fixed[b]).ctypes.data for b in ids]
                if i in slot:
                    ptrs.append(status[slot[i]].ctypes.data)
                args[i] = (ctypes.c_void_p * len(ptrs))(*ptrs)
        inputs = [(name, views[b]) for name, b in self._inputs.items()]
        outputs = {name: views[b] if b in views else self._fixed[b] for name, b in self._outputs.items()}
        return _Arena(memory, views, inputs, outputs, args, self._block(args, 0, len(self.plan.steps)), status)

    def _block(self, args: dict[int, ctypes.Array], start: int, stop: int) -> list[_Item]:
        """Steps ``start:stop`` as items: runs of consecutive kernel steps batched, a
        branch as the blocks of its two ranges (no batch crosses a branch's bounds)."""
        out: list[_Item] = []
        run: list[tuple[int, KernelStep]] = []

        def close() -> None:
            if run:
                kernels = [self._fns[step.kernel] for _, step in run]
                fns = (ctypes.c_void_p * len(run))(*[ctypes.cast(k, ctypes.c_void_p).value for k in kernels])
                argvs = (ctypes.c_void_p * len(run))(*[ctypes.addressof(args[i]) for i, _ in run])
                out.append(_Batch(run[0][0], kernels, fns, argvs))
                run.clear()

        i = start
        while i < stop:
            step = self.plan.steps[i]
            if isinstance(step, KernelStep):
                run.append((i, step))
                i += 1
                continue
            close()
            if isinstance(step, BranchStep):
                middle = i + 1 + step.then_steps
                end = middle + step.else_steps
                out.append(_Fork(i, self._block(args, i + 1, middle), self._block(args, middle, end)))
                i = end
            else:
                out.append(i)
                i += 1
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
            self._run_block(arena.block, arena)
            if self._checked and arena.status.any():
                raise self._index_error(arena.status)
            return [arena.outputs[n].copy() for n in outputs]
        finally:
            self._pool.put(arena)

    def step_times(self, feeds: Mapping[str, np.ndarray]) -> list[tuple[int, float]]:
        """One run for a profile: (step index, seconds) of each step it takes, in order,
        each kernel called on its own through ctypes (no batches: the timer needs each
        one back) with a CPU timer around it. The outputs are not read; a bad index is the
        run's error, as in ``run``. Runs do not use it: their loop has no timer."""
        arena = self._pool.get()
        try:
            self._team.apply()
            for name, dst in arena.inputs:
                np.copyto(dst, feeds[name], casting="no")
            times = []
            clock = time.perf_counter
            for i in step_order(self.plan.steps, lambda branch: self._truth(branch.cond, arena)):
                step = self.plan.steps[i]
                if isinstance(step, BranchStep):
                    continue  # it does nothing itself: step_order read its condition
                t0 = clock()
                if isinstance(step, KernelStep):
                    self._fns[step.kernel](arena.args[i])
                elif isinstance(step, SelectStep):
                    self._select(step, arena)
                else:
                    self._host(step, arena)
                times.append((i, clock() - t0))
            if self._checked and arena.status.any():
                raise self._index_error(arena.status)
            return times
        finally:
            self._pool.put(arena)

    def _run_block(self, block: list[_Item], arena: _Arena) -> None:
        driver = self._driver
        for item in block:
            if isinstance(item, _Batch):
                if driver is not None:
                    driver(len(item.kernels), item.fns, item.argvs)
                else:
                    for j, kernel in enumerate(item.kernels):
                        kernel(arena.args[item.first + j])
            elif isinstance(item, _Fork):
                branch = self.plan.steps[item.step]
                assert isinstance(branch, BranchStep)  # _block forks at branches only
                self._run_block(item.then_block if self._truth(branch.cond, arena) else item.else_block, arena)
            else:
                step = self.plan.steps[item]
                if isinstance(step, SelectStep):
                    self._select(step, arena)
                else:
                    assert isinstance(step, HostStep)  # _block's lone steps are host and select steps
                    self._host(step, arena)

    def _index_error(self, status: np.ndarray) -> ExecutionError:
        """The error of the first kernel that found an index out of range; its status
        words are cleared for the arena's next run."""
        message = self.plan.status_message(status)
        status[...] = 0
        return ExecutionError(message)

    def _array(self, b: int, arena: _Arena) -> np.ndarray:
        return arena.views[b] if b in arena.views else self._fixed[b]

    def _truth(self, b: int, arena: _Arena) -> bool:
        return bool(self._array(b, arena).reshape(-1)[0])

    def _select(self, step: SelectStep, arena: _Arena) -> None:
        for src, dst in zip(step.chosen(self._truth(step.cond, arena)), step.outputs):
            np.copyto(arena.views[dst], self._array(src, arena))

    def _host(self, step: HostStep, arena: _Arena) -> None:
        args = [self._array(b, arena) for b in step.inputs]
        results = step.primitive.evaluate(args)
        for b, r in zip(step.outputs, results, strict=True):
            out = arena.views[b]
            if r.shape != out.shape or r.dtype != out.dtype:
                raise ExecutionError(f"{step.label} returned {r.dtype}{list(r.shape)}, expected {out.dtype}{list(out.shape)}")
            np.copyto(out, r)


def _find_driver(libs: Iterable[NativeLibrary]) -> Callable | None:
    """The step driver from the first kernel library that has it (older plans: none)."""
    for lib in libs:
        fn = lib.function(DRIVER_SYMBOL, required=False)
        if fn is not None:
            fn.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
            fn.restype = None
            return fn
    return None


def _aligned_like(w: np.ndarray) -> np.ndarray:
    out = aligned_empty(w.nbytes).view(w.dtype).reshape(w.shape)
    np.copyto(out, w)
    out.setflags(write=False)  # weights are shared by every run
    return out
