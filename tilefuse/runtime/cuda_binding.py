"""Buffers bound once: a CUDA plan run with no per-run feed handling.

    binding = session.bind({"input_ids": ids_gpu}, outputs={"logits": out_gpu})  # checked once
    binding.run()                       # or run(stream=torch.cuda.current_stream().cuda_stream)
    binding.outputs                     # the bound tensors, or DeviceArrays the binding owns

``run()`` with feeds checks and converts every feed each call (a DLPack exchange, shape and
dtype checks, an output allocated or taken from the pool): 0.15-0.5 ms of host time on the
H200 beside a graph of 0.3-3 ms. A binding does that once. Its run is one CUDA graph of the
plan's kernels reading the bound inputs and writing the bound outputs in place (memory
aligned to 256 bytes, as allocators give it; anything else is copied in or out inside the
graph, as is an output no kernel writes or one that overlaps a bound input), and the copy
of the index-check status words into page-locked host memory; then a wait for the stream
and a look at the status. Plans with host steps (or branches) run copies, steps and copies
without the graph.

The bound memory is read and written at each run, as it is then. Work the caller queued on
the legacy default stream (torch's default) is ordered before the run (the plan's stream
waits for it, as every blocking stream does); work on another stream is ordered by passing
that stream to ``run``. Outputs are written when ``run`` returns; ``run(wait=False)``
returns once the run is queued, its outputs ordered before later work on the legacy
default stream (the plan's stream is a blocking one) and on the stream passed, and an
index error it finds raised by a later run or the session's ``synchronize()``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tilefuse.errors import ExecutionError, InputError
from tilefuse.feeds import DeviceView
from tilefuse.plan.model import KernelStep
from tilefuse.runtime.cuda_launch import in_place
from tilefuse.runtime.device_array import DeviceArray

if TYPE_CHECKING:
    from tilefuse.runtime.cuda import CudaExecutor
    from tilefuse.runtime.cuda_launch import KernelLaunch


@dataclass(frozen=True)
class _Copy:
    dst: int
    src: int
    nbytes: int
    what: str


class CudaBinding:
    """A CUDA executor's inputs and outputs bound to device memory (``CudaExecutor.bind``)."""

    def __init__(self, executor: CudaExecutor, inputs: dict[str, DeviceView], outputs: dict[str, DeviceView | None],
                 keep: tuple[object, ...] = ()) -> None:
        self._ex = executor
        self._keep = (*keep, *inputs.values(), *(v for v in outputs.values() if v is not None))
        graphed = executor._graph is not None  # every step a kernel: the run is one graph
        written = {b for st in executor.plan.steps for b in getattr(st, "outputs", ())} if graphed else set()
        self._moved: dict[int, int] = {}  # buffer id -> bound memory the graph's kernels use in place
        self._in: list[_Copy] = []
        spans = [(v.ptr, v.ptr + v.nbytes) for v in inputs.values()]
        for name, v in inputs.items():
            b = executor._inputs[name]
            if graphed and in_place(v.ptr):  # the kernels read the bound input where it is
                self._moved[b] = v.ptr
            elif v.nbytes:
                self._in.append(_Copy(executor.ptr[b], v.ptr, v.nbytes, f"input {name}"))
        self.outputs: list[DeviceArray | DeviceView] = []
        self._out: list[_Copy] = []
        for name, given in outputs.items():
            buf = executor.plan.buffers[executor._outputs[name]]
            view: DeviceArray | DeviceView
            if given is not None:
                view = given
            else:  # memory of the binding's own, for as long as its array lives
                view = DeviceArray(executor._output_memory(buf.nbytes), buf.type.dtype.numpy, buf.type.shape,
                                   executor, executor.device)
            self.outputs.append(view)
            apart = not any(view.ptr < end and start < view.ptr + buf.nbytes for start, end in spans)
            if buf.id in written and in_place(view.ptr) and apart:  # its kernel writes the bound memory
                self._moved[buf.id] = view.ptr
            elif buf.nbytes:  # from where the run leaves it: a bound input used in place holds it there
                self._out.append(_Copy(view.ptr, self._moved.get(buf.id, executor.ptr[buf.id]), buf.nbytes, f"output {name}"))
            spans.append((view.ptr, view.ptr + buf.nbytes))
        self._launches: list[KernelLaunch | None] = [
            executor._launch_args(i, st, self._moved) if isinstance(st, KernelStep) else None
            for i, st in enumerate(executor.plan.steps)]
        self._graph = executor._capture_bound(self._sequence) if graphed else None
        executor._bindings.add(self)

    def _sequence(self) -> None:
        """The run on the executor's stream: copies in, the plan, copies out, the status."""
        ex, cu = self._ex, self._ex.cu
        for c in self._in:
            ex._check(cu.cuMemcpyDtoDAsync(c.dst, c.src, c.nbytes, ex.stream), f"copying {c.what}")
        if self._moved:  # (only a graphed plan moves buffers: every step is a kernel)
            for step, launch in zip(ex.plan.steps, self._launches):
                assert isinstance(step, KernelStep) and launch is not None
                ex._start(launch, step.kernel)
        else:
            ex.launch_steps()
        for c in self._out:
            ex._check(cu.cuMemcpyDtoDAsync(c.dst, c.src, c.nbytes, ex.stream), f"copying {c.what}")
        ex._status_to_host()

    def run(self, stream: int | None = None, wait: bool = True) -> None:
        """One run of the plan on the bound memory. ``stream``: a CUstream handle (an int,
        e.g. ``torch.cuda.current_stream().cuda_stream``) whose queued work the run waits
        for; None: only the legacy default stream's. ``wait=False``: return once queued;
        that stream (and the legacy default stream) then waits for the run."""
        ex, cu = self._ex, self._ex.cu
        if stream is not None and (isinstance(stream, bool) or not isinstance(stream, int) or stream < 0):
            raise InputError(f"stream must be a CUstream handle (an int) or None, got {stream!r}")
        with ex._lock:
            ex._open()
            if self not in ex._bindings:
                raise ExecutionError("this binding was released (its session closed or the binding replaced)")
            ex._check(cu.cuCtxSetCurrent(ex.ctx), "cuCtxSetCurrent")
            if ex._unwaited:
                ex._check_unwaited()
            if stream:
                ex._check(cu.cuEventRecord(ex._feed_event, cu.CUstream(stream)), "recording the caller's stream")
                ex._check(cu.cuStreamWaitEvent(ex.stream, ex._feed_event, 0), "waiting for the caller's stream")
            if self._graph is not None:
                ex._check(cu.cuGraphLaunch(self._graph, ex.stream), "cuGraphLaunch")
            else:
                self._sequence()
            if wait:
                ex._waited()
                return
            ex._check(cu.cuEventRecord(ex._done_event, ex.stream), "recording the run's end")
            if stream:
                ex._check(cu.cuStreamWaitEvent(cu.CUstream(stream), ex._done_event, 0), "ordering the run's outputs")
            ex._unwaited = True

    def release(self) -> None:
        """Destroy the binding's graph (the executor's close does it too); later runs are
        an ExecutionError."""
        with self._ex._lock:
            if not self._ex._closed:
                self._destroy()

    def _destroy(self) -> None:
        """Called with the executor's lock held, its context current and its stream idle."""
        if self._graph is not None:
            self._ex.cu.cuGraphExecDestroy(self._graph)
        self._graph = None
        self._ex._bindings.discard(self)
