"""Running a plan on the CPU: kernels from shared libraries through ctypes.

Each kernel library is loaded once; each kernel has the ABI ``void SYMBOL(void **args)``
(see tilefuse.codegen.artifact). Weights are copied once into 64-byte aligned memory.
Every run takes an arena from a pool, so concurrent runs never share intermediates;
ctypes releases the GIL while a kernel runs, so threads really run in parallel.

An arena carries what depends only on its address: a numpy view per arena buffer and,
per kernel step, the argument array with every arena and weight pointer filled in. A run
only patches the slots that point at its inputs.

The runtime does not read a kernel's ``launch`` data: a CPU kernel parallelises itself
(OpenMP), so its thread count is the code generator's to build in.
"""
from __future__ import annotations

import ctypes
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from tilefuse.errors import ExecutionError, PlanError
from tilefuse.plan.model import BufferKind, HostStep, Kernel, KernelStep, Plan
from tilefuse.runtime.pool import ArenaPool, aligned_empty

KernelFn = Callable[[ctypes.Array], None]


@dataclass(slots=True)
class _Arena:
    memory: np.ndarray  # keeps the bytes alive
    views: dict[int, np.ndarray]  # buffer id -> typed view, for arena buffers
    args: list[ctypes.Array | None]  # per step: the kernel's argument array (None: host step)


class CpuExecutor:
    """Executes a cpu plan; ``run`` is safe to call from several threads at once."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self._fns = {name: _load_kernel(k) for name, k in plan.kernels.items()}
        self._fixed: dict[int, np.ndarray] = {}  # constant buffers: aligned copies of the weights
        for buf in plan.buffers:
            if buf.kind is BufferKind.CONSTANT:
                self._fixed[buf.id] = _aligned_like(plan.weights[buf.name])
        self._inputs = {b.name: b.buffer for b in plan.inputs}
        self._outputs = {b.name: b.buffer for b in plan.outputs}
        # (step index, argument position, input buffer) for every kernel argument that is a feed
        self._input_slots = [
            (i, pos, b)
            for i, step in enumerate(plan.steps)
            if isinstance(step, KernelStep)
            for pos, b in enumerate(step.inputs)
            if plan.buffers[b].kind is BufferKind.INPUT
        ]
        self._pool: ArenaPool[_Arena] = ArenaPool(self._new_arena)

    def _new_arena(self) -> _Arena:
        memory = aligned_empty(self.plan.arena_bytes)
        views: dict[int, np.ndarray] = {}
        for buf in self.plan.buffers:
            if buf.kind.in_arena:
                assert buf.offset is not None
                raw = memory[buf.offset : buf.offset + buf.nbytes]
                views[buf.id] = raw.view(buf.type.dtype.numpy).reshape(buf.type.shape)
        args: list[ctypes.Array | None] = []
        for step in self.plan.steps:
            if isinstance(step, KernelStep):
                ids = step.inputs + step.outputs
                ptrs = [_address(views.get(b, self._fixed.get(b))) for b in ids]
                args.append((ctypes.c_void_p * len(ids))(*ptrs))
            else:
                args.append(None)
        return _Arena(memory, views, args)

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str]) -> list[np.ndarray]:
        """Run every step; ``feeds`` are already checked (names, dtypes, shapes).

        Returns fresh arrays for ``outputs`` (names of plan outputs), never arena views.
        """
        # Kernels need dense row-major inputs; the contiguous copies live until we return.
        bound = {self._inputs[n]: np.require(a, requirements="C") for n, a in feeds.items()}
        with self._pool.take() as arena:
            for i, pos, b in self._input_slots:
                arena.args[i][pos] = _address(bound[b])  # type: ignore[index]
            for i, step in enumerate(self.plan.steps):
                if isinstance(step, KernelStep):
                    self._fns[step.kernel](arena.args[i])  # type: ignore[arg-type]
                else:
                    self._host(step, arena, bound)
            return [np.array(self._array(self._outputs[n], arena, bound), copy=True) for n in outputs]

    def _array(self, b: int, arena: _Arena, bound: Mapping[int, np.ndarray]) -> np.ndarray:
        if b in arena.views:
            return arena.views[b]
        return self._fixed[b] if b in self._fixed else bound[b]

    def _host(self, step: HostStep, arena: _Arena, bound: Mapping[int, np.ndarray]) -> None:
        args = [self._array(b, arena, bound) for b in step.inputs]
        results = step.primitive.evaluate(args)
        for b, r in zip(step.outputs, results, strict=True):
            out = arena.views[b]
            if r.shape != out.shape or r.dtype != out.dtype:
                raise ExecutionError(f"{step.label} returned {r.dtype}{list(r.shape)}, expected {out.dtype}{list(out.shape)}")
            np.copyto(out, r)


def _load_kernel(kernel: Kernel) -> KernelFn:
    try:
        lib = ctypes.CDLL(_loadable_path(kernel), mode=ctypes.RTLD_LOCAL)
    except OSError as e:
        raise PlanError(f"{kernel.path}: cannot load kernel {kernel.name}: {e}") from None
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


def _address(a: np.ndarray | None) -> int | None:
    # None only for input buffers, patched in by each run before any kernel is called.
    return None if a is None else a.ctypes.data
