"""Running a plan on an NVIDIA GPU with the CUDA driver API (cuda-python's cuda-bindings).

Only numpy and ``cuda.bindings.driver`` are needed: no torch, no tilelang. At load, each
cubin is read once and checked against the plan's sha256, and those bytes become a module
(``cuModuleLoadData``), its entry gets the dynamic shared memory it
asks for, the weights are uploaded once, and one device arena holds every intermediate
and output (offsets from the plan's liveness planning). Input buffers are device
allocations of their own. The launch of every kernel step is fixed then, from its
kernel's ``CudaLaunch`` record (``runtime/cuda_launch.py``: device pointers, TMA
descriptors, programmatic launches).

A run with host feeds copies them in, replays the plan's steps, and copies the requested
outputs back. With device feeds (DLPack or ``__cuda_array_interface__``: torch, CuPy, JAX;
read in ``tilefuse/feeds.py``) the outputs stay on the device (``runtime/device_array.py``),
and a plan of kernels only runs as a second graph whose kernels read the feeds where they
are and write the outputs into their arrays (``runtime/cuda_direct.py``: its nodes are
re-pointed when an address changes); otherwise the feeds and outputs are copied device to
device. DLPack producers are handed the session's stream, and a
run returns only once its stream is done. A plan of kernels only is captured once as a CUDA graph (every address is fixed at
load) and replayed as one launch; a plan with host steps (opaque primitives, run by their
reference on copies) or branches (an If on a run-time condition: the condition is copied
to the host once the steps before it are done, then the branch taken is launched, and its
results are copied device to device to the If's outputs) launches step by step. One arena
per session: runs are serialised. ``close`` releases the graph, modules, device memory and
stream; the primary context goes with the last DeviceArray still alive.

Kernels that check indices read at run time get a status word each, in one device array
(zeroed at load; a kernel writes its word only when it finds an index out of range): a
run copies the array back with its outputs, once, and raises the first word's error,
zeroing the array again.

A profile's run (``step_times``) never uses the graph: it launches the steps one by one,
each kernel between two CUDA events of its own; ``run`` records no events.
"""
from __future__ import annotations

import ctypes
import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from tilefuse.errors import ExecutionError, InputError, PlanError
from tilefuse.feeds import DeviceView, FeedDevice
from tilefuse.plan.files import read_verified
from tilefuse.plan.model import BranchStep, BufferKind, HostStep, Kernel, KernelStep, Plan, SelectStep, Step, step_order
from tilefuse.plan.verify import check_kernel_identity
from tilefuse.runtime import cuda_timing
from tilefuse.runtime.cuda_direct import DirectGraph, Unavailable, run_direct
from tilefuse.runtime.cuda_launch import Handle, KernelLaunch, kernel_launch, launch_kernel, set_up_function
from tilefuse.runtime.device_array import DeviceArray
from tilefuse.torch_feeds import CU_STREAM_LEGACY

if TYPE_CHECKING:
    from tilefuse.runtime.cuda_binding import CudaBinding
    from tilefuse.runtime.cuda_steady import SteadyRun

LAUNCH_MODES = ("as-built", "plain")
# output blocks of one size kept for reuse once their DeviceArrays are collected (a run
# then allocates nothing); more are freed
SPARE_OUTPUTS = 4


def _driver() -> ModuleType:
    try:
        from cuda.bindings import driver
    except ImportError as e:
        raise PlanError(f"running a CUDA plan needs cuda-python (pip install cuda-bindings): {e}") from None
    return driver


class CudaExecutor:
    """Executes a cuda plan on one device; runs are serialised. ``close`` releases the
    modules, device memory, graph and stream, and the primary context once no
    DeviceArray made by this executor is left."""

    _closed = False
    _outstanding = 0  # DeviceArrays not yet freed: each needs the context
    _direct: DirectGraph | None = None  # (set up at load; close may follow a failed load)
    direct_reason = ""
    _unwaited = False  # a run not waited for may have left status words unread
    _steady: SteadyRun | None = None  # the last direct run, to repeat on the same memory

    def __init__(self, plan: Plan, device: int = 0, launch: str = "as-built") -> None:
        if launch not in LAUNCH_MODES:
            raise InputError(f"launch must be one of {LAUNCH_MODES}, got {launch!r}")
        # "plain": kernels built to wait for their predecessor (programmatic launch) are
        # launched in plain stream order anyway, to time the same plan both ways
        self.programmatic = launch == "as-built"
        self.plan = plan
        self.device = device
        self.cu = cu = _driver()
        # Reentrant: a DeviceArray collected while a run holds the lock frees itself through it.
        self._lock = threading.RLock()
        self._allocs: list[int] = []
        self._spare: dict[int, list[int]] = {}  # output memory given back, by size, for the next runs
        self._sizes: dict[int, int] = {}  # each DeviceArray's bytes, by pointer
        self._feed_event: Handle | None = None
        self._done_event: Handle | None = None  # the last run not waited for, on the plan's stream
        self._bindings: set[CudaBinding] = set()  # alive: their graphs go with the executor
        self._pinned = 0  # page-locked host memory of the status words
        self._modules: list[Handle] = []
        self._graph: Handle | None = None
        self.stream: Handle | None = None
        self.ctx: Handle | None = None
        try:  # (a newer cuda-bindings raises where it finds no driver library)
            initialised = cu.cuInit(0)
        except Exception as e:
            raise ExecutionError(f"no NVIDIA driver to run this CUDA plan on (cuInit: {e})") from None
        self._check(initialised, "cuInit")
        self._dev = self._check(cu.cuDeviceGet(device), "cuDeviceGet")
        self.ctx = self._check(cu.cuDevicePrimaryCtxRetain(self._dev), "cuDevicePrimaryCtxRetain")
        try:
            self._set_up()
        except BaseException:
            self.close()
            raise

    def _set_up(self) -> None:
        cu, plan = self.cu, self.plan
        self._check(cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        self.stream = self._check(cu.cuStreamCreate(0), "cuStreamCreate")  # blocking: after the legacy stream's work
        flags = int(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING)
        self._feed_event = self._check(cu.cuEventCreate(flags), "cuEventCreate")
        self._done_event = self._check(cu.cuEventCreate(flags), "cuEventCreate")
        self._functions = {name: self._load(k) for name, k in plan.kernels.items()}
        arena = self._alloc(plan.arena_bytes)
        self.ptr: dict[int, int] = {}
        for buf in plan.buffers:
            if buf.kind.in_arena:
                self.ptr[buf.id] = arena + int(buf.offset or 0)
            elif buf.kind is BufferKind.CONSTANT:
                w = np.ascontiguousarray(plan.weights[buf.name])
                self.ptr[buf.id] = self._alloc(w.nbytes)
                self._h2d(self.ptr[buf.id], w)
            else:
                self.ptr[buf.id] = self._alloc(buf.nbytes)
        self._check(cu.cuStreamSynchronize(self.stream), "uploading the weights")
        self._inputs = {b.name: b.buffer for b in plan.inputs}
        self._outputs = {b.name: b.buffer for b in plan.outputs}
        # name -> (buffer id, bytes, dtype, shape): what a direct run asks of each output, once
        self._output_specs = {b.name: (b.buffer, plan.buffers[b.buffer].nbytes, plan.buffers[b.buffer].type.dtype.numpy,
                                       tuple(plan.buffers[b.buffer].type.shape)) for b in plan.outputs}
        self._checked = plan.checked_steps()  # step index of each status word
        # the status words' host copy, page-locked so a graph can copy them as its last node
        self._status: np.ndarray = np.zeros((len(self._checked), 2), np.int64)
        if self._checked:
            self._pinned = int(self._check(cu.cuMemHostAlloc(self._status.nbytes, 0), "cuMemHostAlloc"))
            words = (ctypes.c_int64 * self._status.size).from_address(self._pinned)
            self._status = np.ctypeslib.as_array(words).reshape(self._status.shape)
            self._status[...] = 0
        self._status_zero = bytes(self._status.nbytes)
        self._status_ptr = self._alloc(self._status.nbytes) if self._checked else 0
        self._h2d(self._status_ptr, self._status)
        self._launches: list[KernelLaunch | None] = [self._launch_args(i, s) if isinstance(s, KernelStep) else None
                                                for i, s in enumerate(plan.steps)]
        self._graph = self._capture() if all(isinstance(s, KernelStep) for s in plan.steps) else None
        self._written = {b for st in plan.steps for b in getattr(st, "outputs", ())}
        # run()'s graph over the caller's tensors (runtime/cuda_direct.py), made at the first
        # run with GPU feeds; ``direct_reason`` says why there is none, where there is not
        self._direct = None
        self.direct_reason = "" if self._graph is not None else "the plan has host steps or branches"

    def close(self) -> None:
        """Release everything this executor holds on the device (idempotent; no run may
        be in flight). Errors are ignored: there is nothing left to do about them."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            cu = self.cu
            if self.ctx is not None:
                cu.cuCtxSetCurrent(self.ctx)
            if self.stream is not None:
                cu.cuStreamSynchronize(self.stream)
            if self._graph is not None:
                cu.cuGraphExecDestroy(self._graph)
            if self._direct is not None:
                self._direct.destroy()
                self._direct = None
            for binding in list(self._bindings):
                binding._destroy()
            if self._pinned:
                self._status = self._status.copy()  # before the page-locked memory goes
                cu.cuMemFreeHost(self._pinned)
                self._pinned = 0
            self._graph, self._launches, self._functions = None, [], {}
            for module in self._modules:
                cu.cuModuleUnload(module)
            for ptr in self._allocs + [p for spare in self._spare.values() for p in spare]:
                cu.cuMemFree(ptr)
            self._spare = {}
            for event in (self._feed_event, self._done_event):
                if event is not None:
                    cu.cuEventDestroy(event)
            self._feed_event = self._done_event = None
            self._modules, self._allocs, self.ptr = [], [], {}
            if self.stream is not None:
                cu.cuStreamDestroy(self.stream)
            self._release_context()

    def _release_context(self) -> None:
        """Called under the lock once closed: the primary context goes when the last
        DeviceArray does (freeing them needs it; the driver frees what is left with it)."""
        if self.ctx is not None and self._closed and not self._outstanding:
            self.cu.cuDevicePrimaryCtxRelease(self._dev)
            self.ctx = None

    def _open(self) -> None:
        if self._closed:
            raise ExecutionError("this CUDA executor is closed: its modules and device memory are released")

    def _capture(self) -> Handle:
        return self._capture_bound(self.launch_steps)

    def _capture_bound(self, sequence: Callable[[], None]) -> Handle:
        """An executable graph of what ``sequence()`` queues on the stream."""
        cu = self.cu
        mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        self._check(cu.cuStreamBeginCapture(self.stream, mode), "cuStreamBeginCapture")
        try:
            sequence()
        finally:
            graph = self._check(cu.cuStreamEndCapture(self.stream), "cuStreamEndCapture")
        try:
            return self._check(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        finally:
            cu.cuGraphDestroy(graph)  # the executable graph does not need it

    @property
    def feed_device(self) -> FeedDevice:
        """The device and stream GPU feeds are read on (see ``InferenceSession``)."""
        assert self.stream is not None, "made at load"
        return FeedDevice(self.device, int(self.stream))

    # -- driver helpers ------------------------------------------------------------------
    def _check(self, result: Any, what: str) -> Any:
        """What a driver call returned past its CUresult (None, one value, or a tuple);
        an ExecutionError naming ``what`` if it failed (cuda-bindings is untyped)."""
        err, *rest = result if isinstance(result, tuple) else (result,)
        if err != self.cu.CUresult.CUDA_SUCCESS:
            _, name = self.cu.cuGetErrorName(err)
            raise ExecutionError(f"CUDA {what} failed: {name.decode() if isinstance(name, bytes) else name}")
        return rest[0] if len(rest) == 1 else (rest or None)

    def _alloc(self, nbytes: int) -> int:
        ptr = int(self._check(self.cu.cuMemAlloc(max(nbytes, 256)), "cuMemAlloc"))
        self._allocs.append(ptr)
        return ptr

    def _h2d(self, ptr: int, a: np.ndarray) -> None:
        if a.nbytes:
            self._check(self.cu.cuMemcpyHtoDAsync(ptr, a.ctypes.data, a.nbytes, self.stream), "cuMemcpyHtoD")

    def _d2h(self, a: np.ndarray, ptr: int) -> None:
        if a.nbytes:
            self._check(self.cu.cuMemcpyDtoHAsync(a.ctypes.data, ptr, a.nbytes, self.stream), "cuMemcpyDtoH")

    def _load(self, kernel: Kernel) -> Handle:
        """The kernel's function, from a module loaded from its verified bytes (cuda's
        ModuleGetFunction looks in that module only: the symbol can name nothing else)."""
        cu = self.cu
        check_kernel_identity(kernel, self.plan.target)  # a plan built in memory is checked here
        image = read_verified(kernel.path, kernel.sha256, f"kernel {kernel.name}")
        module = self._check(cu.cuModuleLoadData(image), f"cuModuleLoadData({kernel.path.name})")
        self._modules.append(module)
        fn = self._check(cu.cuModuleGetFunction(module, kernel.symbol.encode()), f"cuModuleGetFunction({kernel.symbol})")
        set_up_function(cu, self._check, fn, kernel)
        return fn

    def _launch_args(self, index: int, step: KernelStep, moved: Mapping[int, int] | None = None) -> KernelLaunch:
        """A kernel step's launch; ``moved``: buffers that live elsewhere for this launch
        (a binding's inputs and outputs, by buffer id)."""
        where = {**self.ptr, **moved} if moved else self.ptr
        ptrs = [where[b] for b in step.inputs + step.outputs]
        if step.sites:  # the kernel's status word, after its buffers
            ptrs.append(self._status_ptr + self._status[0].nbytes * self._checked.index(index))
        return kernel_launch(self.cu, self._check, self.plan.kernels[step.kernel], self._functions[step.kernel], ptrs,
                             self.stream, self.programmatic)

    def _start(self, launch: KernelLaunch, kernel: str) -> None:
        """Launch one kernel step on the session's stream (asynchronous)."""
        launch_kernel(self.cu, self._check, launch, self.stream, kernel)

    # -- running -------------------------------------------------------------------------
    def run_steady(self, feeds: object, outputs: object) -> list[DeviceArray] | None:
        """The run of the last direct run's tensors again, launched and waited for with no
        feed reading, or None (nothing done) where ``feeds`` are not those tensors as they
        were (``runtime/cuda_steady.py``); then ``run`` takes them."""
        steady = self._steady
        return None if steady is None else steady.run(self, feeds, outputs)

    def run(self, feeds: Mapping[str, np.ndarray | DeviceView], outputs: Sequence[str],
            wait: bool = True) -> list[np.ndarray | DeviceArray]:
        """Host feeds give host outputs (numpy); if any feed is a device tensor, the
        outputs are DeviceArrays (device memory of their own, no host copy), written in
        place by the plan's kernels where the plan is one graph (``cuda_direct.run_direct``).
        ``wait=False`` (device feeds that each name their stream, on such a plan): return
        once the run is queued, its outputs ordered on the feeds' streams (``cuda_direct.run_direct``)."""
        cu = self.cu
        with self._lock:
            self._open()
            self._check(cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
            if self._unwaited:
                self._check_unwaited()
            if any(isinstance(a, DeviceView) for a in feeds.values()) and self._direct_graph() is not None:
                return run_direct(self, feeds, outputs, wait)
            on_device, held = self._copy_in(feeds)
            self.launch_all()
            results: list[np.ndarray | DeviceArray] = []
            for name in outputs:
                buf = self.plan.buffers[self._outputs[name]]
                out: np.ndarray | DeviceArray
                if on_device:
                    ptr = self._output_memory(buf.nbytes)
                    out = DeviceArray(ptr, buf.type.dtype.numpy, buf.type.shape, self, self.device)
                    if buf.nbytes:
                        self._check(cu.cuMemcpyDtoDAsync(ptr, self.ptr[buf.id], buf.nbytes, self.stream),
                                    f"copying output {name}")
                else:
                    out = np.empty(buf.type.shape, buf.type.dtype.numpy)
                    self._d2h(out, self.ptr[buf.id])
                results.append(out)
            self._finish()
            return results

    def _finish(self) -> None:
        """Wait for the run; raise the first index error its kernels found."""
        self._status_to_host()
        self._waited()

    def _waited(self) -> None:
        """Wait for the plan's stream; raise the first index error found by the runs it
        held (the status words stay set until read, so a run not waited for reports here)."""
        self._check(self.cu.cuStreamSynchronize(self.stream), "running the plan")
        unwaited, self._unwaited = self._unwaited, False
        if self._status_set():
            raise self._index_error(unwaited)

    def _check_unwaited(self) -> None:
        """Raise the index error of runs not waited for, once they are done (a look at
        their event: nothing is waited for here)."""
        if self.cu.cuEventQuery(self._done_event)[0] != self.cu.CUresult.CUDA_SUCCESS:  # (err,), as every call
            return  # still running (or failed: the next wait says so)
        self._unwaited = False
        if self._status_set():
            raise self._index_error(True)

    def _status_set(self) -> bool:
        """Whether a status word is set (its bytes against zeros: a tenth of ``any()``'s
        time on a few words, once per run)."""
        return self._status.tobytes() != self._status_zero

    def _direct_graph(self) -> DirectGraph | None:
        """run()'s graph over the caller's tensors, made at the first call; None where the
        plan is not one graph or the driver cannot re-point its nodes (then run() copies)."""
        if self._direct is None and self._graph is not None and not self.direct_reason:
            try:
                self._direct = DirectGraph(self)
            except Unavailable as e:
                self.direct_reason = f"the driver does not name captured nodes ({e})"
        return self._direct

    def bind(self, inputs: dict[str, DeviceView], outputs: dict[str, DeviceView | None]) -> CudaBinding:
        """A CudaBinding (runtime/cuda_binding.py) of checked device feeds and outputs
        (None: memory the binding owns), captured as one graph where the plan has one."""
        from tilefuse.runtime.cuda_binding import CudaBinding

        with self._lock:
            self._open()
            self._check(self.cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
            return CudaBinding(self, inputs, outputs)

    def synchronize(self) -> None:
        """Wait for all work on the device (the caller's included)."""
        with self._lock:
            self._open()
            self._check(self.cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
            self._check(self.cu.cuCtxSynchronize(), "cuCtxSynchronize")
            if self._unwaited:
                self._waited()

    def _status_to_host(self) -> None:
        """Queue the status words' copy to the host (asynchronous: page-locked memory)."""
        if self._checked:
            self._check(self.cu.cuMemcpyDtoHAsync(self._status.ctypes.data, self._status_ptr, self._status.nbytes,
                                                  self.stream), "copying the status words")

    def _copy_in(self, feeds: Mapping[str, np.ndarray | DeviceView]) -> tuple[bool, list[np.ndarray]]:
        """Queue the feeds' copies to their input buffers on the stream (the lock held, the
        context current): whether any feed is on the device, and the host arrays the
        copies read from, to keep alive until the stream is done."""
        cu = self.cu
        views = [a for a in feeds.values() if isinstance(a, DeviceView)]
        self._order_after(views)
        held: list[np.ndarray] = []
        for name, a in feeds.items():
            dst = self.ptr[self._inputs[name]]
            if isinstance(a, DeviceView):
                if a.nbytes:
                    self._check(cu.cuMemcpyDtoDAsync(dst, a.ptr, a.nbytes, self.stream), f"copying input {name}")
                continue
            a = np.ascontiguousarray(a)
            held.append(a)
            self._h2d(dst, a)
        return bool(views), held

    def _order_after(self, views: list[DeviceView]) -> None:
        """Make the plan's stream wait for the feeds' pending writes: nothing for DLPack
        feeds (their producers ordered them before this stream) and ready ones; an event on
        each stream a __cuda_array_interface__ feed or torch names, but the legacy default
        stream (torch's default: the plan's stream is a blocking one, which waits for it
        anyway); the whole device only for a feed that names none (version 2)."""
        cu = self.cu
        streams: set[int] = set()
        for v in views:
            if v.ready == "stream":
                if v.stream != CU_STREAM_LEGACY:
                    streams.add(v.stream)
            elif v.ready == "unknown":
                self._check(cu.cuCtxSynchronize(), "waiting for the device feeds")
                return
        for stream in sorted(streams):
            self._check(cu.cuEventRecord(self._feed_event, cu.CUstream(stream)), "recording a feed's stream")
            self._check(cu.cuStreamWaitEvent(self.stream, self._feed_event, 0), "waiting for a feed's stream")

    def _output_memory(self, nbytes: int, prefer: int | None = None) -> int:
        """Device memory for one output of ``nbytes``: a block an earlier output left
        (DeviceArrays give theirs back when collected; ``prefer``, the block this output
        had last, where it is free: the direct graph then needs no re-pointing), else a
        new one."""
        spare = self._spare.get(nbytes)
        if spare and prefer in spare:
            spare.remove(prefer)
            ptr = prefer
        else:
            ptr = spare.pop() if spare else int(self._check(self.cu.cuMemAlloc(max(nbytes, 256)), "cuMemAlloc"))
        self._sizes[ptr] = nbytes
        self._outstanding += 1
        return ptr

    def _index_error(self, unwaited: bool = False) -> ExecutionError:
        """The error of the first kernel that found an index out of range (``unwaited``: in
        a run not waited for, or this one); the status words are zeroed on the device for
        the next run."""
        message = self.plan.status_message(self._status)
        self._clear_status()
        return ExecutionError(f"a run not waited for (or this one): {message}" if unwaited else message)

    def _clear_status(self) -> None:
        """Zero the status words (after an error, and after tools' runs, which do not read
        them: a bad index they met must not fail the next run)."""
        if self._checked:
            self._status[...] = 0
            self._h2d(self._status_ptr, self._status)
            self._check(self.cu.cuStreamSynchronize(self.stream), "clearing the status words")

    def download(self, a: DeviceArray) -> np.ndarray:
        """A host copy of a DeviceArray this executor made (also once it is closed: the
        array keeps the context, and the copy then needs no stream)."""
        out = np.empty(a.shape, a.dtype)
        with self._lock:
            self._check(self.cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
            if self._closed:
                if out.nbytes:
                    self._check(self.cu.cuMemcpyDtoH(out.ctypes.data, a.ptr, out.nbytes), "copying a device array")
                return out
            self._d2h(out, a.ptr)
            self._check(self.cu.cuStreamSynchronize(self.stream), "copying a device array")
        return out

    def free(self, ptr: int) -> None:
        """Release a DeviceArray's memory (its finaliser; errors at shutdown are moot),
        and the context with the last one once the executor is closed."""
        try:
            with self._lock:
                self._outstanding -= 1
                nbytes = self._sizes.pop(ptr, None)
                spare = self._spare.setdefault(nbytes, []) if nbytes is not None and not self._closed else None
                if spare is not None and len(spare) < SPARE_OUTPUTS:
                    spare.append(ptr)  # the next run's output of this size takes it
                    return
                self.cu.cuCtxSetCurrent(self.ctx)
                self.cu.cuMemFree(ptr)
                self._release_context()
        except Exception:  # noqa: BLE001 - interpreter teardown
            pass

    def launch_all(self) -> None:
        """The whole plan on the session's stream: one graph launch where there is a graph."""
        if self._graph is not None:
            self._check(self.cu.cuGraphLaunch(self._graph, self.stream), "cuGraphLaunch")
        else:
            self.launch_steps()

    def launch_steps(self) -> None:
        """Every step a run takes, in order, on the session's stream (asynchronous except
        host steps and branches, which wait for the condition)."""
        for i in step_order(self.plan.steps, self._truth):
            self._step(i)

    def step_by_step(self) -> Iterator[Step]:
        """Every step a run takes, in order, each waited for: yields the step once its
        outputs are written (``read_buffer`` reads them). For tools that look between
        kernels; runs do not use it."""
        cu = self.cu
        for i in step_order(self.plan.steps, self._truth):
            step = self.plan.steps[i]
            self._step(i)
            if self._launches[i] is not None:
                assert isinstance(step, KernelStep)  # only kernel steps have launches
                self._check(cu.cuStreamSynchronize(self.stream), f"running {step.kernel}")
            yield step
        self._clear_status()

    def _step(self, i: int) -> None:
        step, launch = self.plan.steps[i], self._launches[i]
        if launch is not None:
            assert isinstance(step, KernelStep)  # only kernel steps have launches
            self._start(launch, step.kernel)
        elif isinstance(step, HostStep):
            self._host(step)
        elif isinstance(step, SelectStep):
            self._select(step, self._truth(step))
        # a BranchStep does nothing itself: step_order asked ``_truth`` which branch to take

    def _select(self, step: SelectStep, cond: bool) -> None:
        """Copy the results of the branch ``cond`` took to the If's outputs (queued)."""
        for src, dst in zip(step.chosen(cond), step.outputs):
            n = self.plan.buffers[dst].nbytes
            if n:
                self._check(self.cu.cuMemcpyDtoDAsync(self.ptr[dst], self.ptr[src], n, self.stream),
                            f"{step.label}: copying buffer {src}")

    def _truth(self, step: BranchStep | SelectStep) -> bool:
        """A branch's condition, read once the steps before it are done."""
        return bool(self.read_buffer(step.cond).reshape(-1)[0])

    def read_buffer(self, b: int) -> np.ndarray:
        """Plan buffer ``b`` copied to the host now."""
        buf = self.plan.buffers[b]
        a = np.empty(buf.type.shape, buf.type.dtype.numpy)
        self._d2h(a, self.ptr[b])
        self._check(self.cu.cuStreamSynchronize(self.stream), f"reading buffer {buf.name}")
        return a

    def _host(self, step: HostStep) -> None:
        args = []
        for b in step.inputs:
            buf = self.plan.buffers[b]
            a = np.empty(buf.type.shape, buf.type.dtype.numpy)
            self._d2h(a, self.ptr[b])
            args.append(a)
        self._check(self.cu.cuStreamSynchronize(self.stream), f"before host step {step.label}")
        results = []  # kept alive until the copies are done
        for b, r in zip(step.outputs, step.primitive.evaluate(args), strict=True):
            buf = self.plan.buffers[b]
            results.append(np.ascontiguousarray(r, dtype=buf.type.dtype.numpy).reshape(buf.type.shape))
            self._h2d(self.ptr[b], results[-1])
        self._check(self.cu.cuStreamSynchronize(self.stream), f"after host step {step.label}")

    # -- timing, for profiles and benchmarks (runtime/cuda_timing.py) ------------------
    def timed_steps(self, repeats: int) -> list[tuple[str, float]]:
        """(kernel, ms) of every kernel step, each launched ``repeats`` times back to back."""
        return cuda_timing.timed_steps(self, repeats)

    def step_times(self, feeds: Mapping[str, np.ndarray | DeviceView]) -> list[tuple[int, float]]:
        """One run for a profile: (step index, seconds) of each step it takes, in order."""
        return cuda_timing.step_times(self, feeds)

    def timed(self, repeats: int, graph: bool = True) -> list[float]:
        """Device time of ``repeats`` runs of the plan (ms each), as one graph launch or step by step."""
        return cuda_timing.timed(self, repeats, graph)
