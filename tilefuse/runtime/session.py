"""InferenceSession: load a plan and run it, with onnxruntime's interface.

The session checks inputs and picks the executor of the plan's target family (its
``Backend``, ``tilefuse.backends``); executors (``cpu.CpuExecutor``, ``cuda.CudaExecutor``)
only run steps. An executor is built as
``Executor(plan)`` and offers ``run(feeds, output_names) -> list[np.ndarray]``, taking
checked feeds and returning fresh arrays; it must be safe to call from several threads.
One that can be profiled offers ``step_times(feeds) -> [(step index, seconds)]`` too.
``close()`` releases what it holds (libraries, device memory, modules, streams); the
session calls it once no run is in flight. One whose kernels run on host threads says so
with ``threaded = True``: it is built as ``Executor(plan, threads)`` and reports the count
its kernels run with as ``threads``. An executor that reads GPU tensors says where as
``feed_device`` (a ``feeds.FeedDevice``); the session then lets GPU feeds through as
``DeviceView``s.

A session releases its executor on ``close()``, at the end of a ``with`` block, or when
it is garbage-collected (a finaliser), whichever comes first; a run after that is an
ExecutionError. Closing waits for the runs in flight on other threads.
"""
from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Protocol, Sequence

import numpy as np

from tilefuse import backends
from tilefuse.errors import ExecutionError, InputError, PlanError
from tilefuse.feeds import DeviceView, FeedChecker, check_feeds
from tilefuse.ir.dtypes import DType
from tilefuse.ir.types import TensorType
from tilefuse.plan import Plan, load_plan

# ONNX's names for tensor element types, as onnxruntime's NodeArg.type spells them.
_ONNX_TYPE = {
    DType.FLOAT32: "float", DType.FLOAT16: "float16", DType.BFLOAT16: "bfloat16", DType.FLOAT64: "double",
    DType.INT8: "int8", DType.INT16: "int16", DType.INT32: "int32", DType.INT64: "int64",
    DType.UINT8: "uint8", DType.UINT16: "uint16", DType.UINT32: "uint32", DType.UINT64: "uint64",
    DType.BOOL: "bool",
}


@dataclass(frozen=True)
class NodeArg:
    """An input or output: ``type`` is like "tensor(float)"; shapes are static."""

    name: str
    shape: list[int]
    type: str


def _executor(target: str) -> type | None:
    backend = backends.find(backends.family(target))
    return backend.executor() if backend is not None else None


def takes_threads(target: str) -> bool:
    """Whether a plan for ``target`` runs kernels on host threads (takes ``threads=``)."""
    return getattr(_executor(target), "threaded", False)


class _Lifetime:
    """Counts the runs in flight; ``close`` refuses new ones and waits for those."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())  # (a plain lock: taken twice a run)
        self._runs = 0
        self.closed = False

    @contextmanager
    def run(self) -> Iterator[None]:
        self.enter()
        try:
            yield
        finally:
            self.leave()

    def enter(self) -> None:
        """A run starts (``run()``'s own path: a generator-based context costs a run some
        microseconds); ``leave`` must follow, whatever happens."""
        with self._cond:
            if self.closed:
                raise ExecutionError("this InferenceSession is closed; create a new one to run the plan again")
            self._runs += 1

    def leave(self) -> None:
        with self._cond:
            self._runs -= 1
            if not self._runs:
                self._cond.notify_all()

    def close(self) -> bool:
        """True for the call that closed it (after the runs in flight have finished)."""
        with self._cond:
            if self.closed:
                return False
            self.closed = True
            self._cond.wait_for(lambda: self._runs == 0)
            return True


class _Closable(Protocol):
    def close(self) -> None: ...


def _release(lifetime: _Lifetime, executor: _Closable) -> None:
    if lifetime.close():
        executor.close()


class InferenceSession:
    """``InferenceSession("model.tfplan")`` or ``InferenceSession(plan, threads=2)``; also a
    context manager (``with InferenceSession(path) as sess:``) that closes it at the end.

    ``threads`` is onnxruntime's ``intra_op_num_threads``: the threads a CPU plan's parallel
    kernels use (None or 0: ``OMP_NUM_THREADS``, else one per core the process may use).
    Each session keeps its own, whichever thread runs it; ``session.threads`` is the count
    they run with (None on a plan whose kernels run on a GPU). ``launch`` (GPU plans):
    "as-built" (the default: kernels built to overlap their predecessor's end are launched
    programmatically) or "plain" (every kernel in plain stream order). ``run(output_names,
    feeds)`` is safe to call from several threads at once.
    """

    def __init__(self, path_or_plan: str | Path | Plan, *, threads: int | None = None,
                 launch: str | None = None) -> None:
        self.plan = path_or_plan if isinstance(path_or_plan, Plan) else load_plan(path_or_plan)
        executor = _executor(self.plan.target)
        if executor is None:
            raise PlanError(f"no runtime for target {self.plan.target!r} in this tilefuse; runtimes: {backends.families()}")
        self._threaded = takes_threads(self.plan.target)
        if self._threaded:
            if launch is not None:
                raise InputError(f"launch={launch!r}: a {self.plan.target} plan has no GPU launches")
            self._executor = executor(self.plan, threads)
        elif threads:
            raise InputError(f"threads={threads!r}: a {self.plan.target} plan's kernels do not run on host threads")
        elif launch is not None:
            self._executor = executor(self.plan, launch=launch)
        else:
            self._executor = executor(self.plan)
        self.threads: int | None = getattr(self._executor, "threads", None)
        self._lifetime = _Lifetime()
        # Not at exit: the process's end releases everything, and the CUDA driver may be gone.
        self._finalizer = weakref.finalize(self, _release, self._lifetime, self._executor)
        self._finalizer.atexit = False
        self._check = FeedChecker(self.plan.input_types(), getattr(self._executor, "feed_device", None))
        self._outputs = [name for name, _ in self.plan.output_types()]
        # a CUDA executor's repeat of its last run on the same tensors (runtime/cuda_steady.py)
        self._steady: Callable[[object, object], list | None] | None = \
            getattr(self._executor, "run_steady", None)

    def close(self) -> None:
        """Release the kernels, memory and (CUDA) device resources of this session, once
        the runs in flight have finished. Idempotent; later runs are an ExecutionError.
        GPU outputs (DeviceArray) stay valid until they are freed."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return self._lifetime.closed

    def __enter__(self) -> InferenceSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get_inputs(self) -> list[NodeArg]:
        return [_arg(n, t) for n, t in self.plan.input_types()]

    def get_outputs(self) -> list[NodeArg]:
        return [_arg(n, t) for n, t in self.plan.output_types()]

    def run(self, output_names: Sequence[str] | None, feeds: Mapping[str, object], *,
            wait: bool = True) -> list[np.ndarray]:
        """The requested outputs (all when None), in that order, as fresh arrays. On a CUDA
        plan, feeds may be GPU tensors (DLPack or ``__cuda_array_interface__``: torch, CuPy,
        JAX); then the outputs are ``DeviceArray``s that stay on the GPU and export both
        (``torch.from_dlpack(out)``). ``wait=False`` with GPU feeds that name their stream
        (torch tensors; ``run_direct`` in runtime/cuda_direct.py): return once the run is queued,
        its outputs ordered on that stream, as a torch operation's are; an index error
        is then raised by a later run or ``synchronize()``. Elsewhere runs always wait."""
        if wait and self._steady is not None:  # the last run's GPU tensors again: launch and wait
            steady = self._steady(feeds, self._outputs if output_names is None else output_names)
            if steady is not None:
                return steady
        names = self._output_names(output_names)
        self._lifetime.enter()
        try:
            arrays = self._check(feeds)
            if wait or self._threaded:  # (a CPU run is done when it returns)
                return self._executor.run(arrays, names)
            return self._executor.run(arrays, names, wait=False)
        finally:
            self._lifetime.leave()

    def synchronize(self) -> None:
        """Wait for every run not waited for (``run(..., wait=False)``) and raise the index
        error one of them found; nothing to do on a CPU plan."""
        sync = getattr(self._executor, "synchronize", None)
        if sync is not None:
            with self._lifetime.run():
                sync()

    def bind(self, inputs: Mapping[str, object], outputs: Mapping[str, object] | Sequence[str] | None = None):
        """Inputs and outputs bound to GPU memory once, for runs with no per-run feed
        handling (CUDA plans; ``runtime/cuda_binding.py``): ``inputs`` maps every input to
        a GPU tensor, checked here as ``run`` checks feeds; ``outputs`` maps outputs to GPU
        tensors of their dtype and shape to be written, or lists the outputs wanted in
        memory the binding owns (None: every output). Returns the binding: ``run()`` runs
        the plan on that memory, ``outputs`` holds the output tensors in order."""
        bind = getattr(self._executor, "bind", None)
        if bind is None:
            raise InputError(f"bind: a {self.plan.target} plan takes host feeds; call run() (binding is for GPU plans)")
        with self._lifetime.run():
            views = self._check(inputs)
            host = [n for n, v in views.items() if not isinstance(v, DeviceView)]
            if host:
                raise InputError(f"bind: input(s) {host} are host arrays; bind GPU tensors (or call run() with them)")
            if outputs is None or not isinstance(outputs, Mapping):
                targets: dict[str, object] = {n: None for n in self._output_names(outputs)}
            else:
                names = self._output_names(list(outputs))
                types = dict(self.plan.output_types())
                try:  # checked as feeds are, and named as what they are
                    given = check_feeds([(n, types[n]) for n in names], outputs, self._executor.feed_device)
                except InputError as e:
                    raise InputError(f"bind: output {str(e).removeprefix('input ')}") from None
                host = [n for n, v in given.items() if not isinstance(v, DeviceView)]
                if host:
                    raise InputError(f"bind: output(s) {host} are host arrays; bind GPU tensors to be written")
                targets = dict(given)
            return bind(dict(views), targets)

    def step_times(self, feeds: Mapping[str, object]) -> list[tuple[int, float]]:
        """One run for a profile (``tilefuse profile``): (index into ``plan.steps``,
        seconds) of each step the run takes, in order, each step timed on its own (CPU: a
        timer around each kernel call; CUDA: events around each launch, no graph). Slower
        than ``run``, which times nothing; the outputs are not returned."""
        timer = getattr(self._executor, "step_times", None)
        if timer is None:
            raise ExecutionError(f"the {self.plan.target} runtime cannot time the steps of a run")
        with self._lifetime.run():
            return timer(self._check(feeds))

    def _output_names(self, output_names: object) -> list[str]:
        """``output_names`` checked: None (every output) or a list of the plan's output names."""
        if output_names is None:
            return list(self._outputs)
        if isinstance(output_names, (str, bytes)) or not isinstance(output_names, Iterable):
            what = type(output_names).__name__ + (f" {output_names!r}" if len(repr(output_names)) <= 40 else "")
            raise InputError(f"output_names must be a list of output names or None, got {what}")
        names = list(output_names)
        unknown = [n for n in names if n not in self._outputs]
        if unknown:
            raise InputError(f"unknown output name(s) {unknown}; the plan's outputs are {self._outputs}")
        return names


def onnx_type_name(dtype: DType) -> str:
    """ONNX's name of an element type, as onnxruntime's NodeArg.type spells it ("float")."""
    return _ONNX_TYPE[dtype]


def _arg(name: str, t: TensorType) -> NodeArg:
    return NodeArg(name, list(t.shape), f"tensor({onnx_type_name(t.dtype)})")
