"""Runs on GPU feeds with no copies: one graph of the plan's kernels, re-pointed per run.

``run()`` with GPU feeds used to copy every feed into the plan's input buffers and every
output out of the arena: two stream operations per tensor beside a graph replay, 80-90 us
of a bert-base run at batch 1 on the H200. A ``DirectGraph`` is the plan's graph captured
once more, with the driver's handle of each kernel node kept: a run points the nodes that
read a feed or write an output at the caller's tensor and at the output's own memory
(``cuGraphExecKernelNodeSetParams``, only for the buffers whose address changed since the
last run: a server that feeds tensors from torch's caching allocator and drops each run's
outputs gives the same addresses run after run, so nothing is re-pointed), then launches
the graph. Memory a kernel may not use in place (not aligned to 256 bytes, or an output
that overlaps a feed) is copied as before; so is an output no kernel writes.

``run_direct`` is that run (the executor's lock held): it decides per feed and output
whether the kernels use its memory, points the graph, launches it, copies what could not
be used in place, and waits or orders the outputs on the feeds' streams; a waited run that
copied nothing leaves a ``SteadyRun`` (``runtime/cuda_steady.py``) for the next.

The driver's capture info names the node each launch added (the stream's one dependency
after it). A driver or cuda-bindings that does not say it makes the graph unavailable,
and ``run()`` copies as before (``CudaExecutor.direct_reason`` says why).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from tilefuse.feeds import DeviceView
from tilefuse.plan.model import KernelStep
from tilefuse.runtime.cuda_launch import in_place
from tilefuse.runtime.cuda_steady import SteadyRun
from tilefuse.runtime.device_array import DeviceArray

if TYPE_CHECKING:
    from tilefuse.runtime.cuda import CudaExecutor
    from tilefuse.runtime.cuda_launch import Handle, KernelLaunch


class Unavailable(Exception):
    """The driver cannot say which graph node a captured launch became."""


def _captured_node(cu: object, stream: Handle) -> Handle:
    """The node the last operation queued on ``stream`` (being captured) became. The
    capture info is (result, status, id, graph, dependencies, ...) in every cuda-bindings
    that has it (CUDA 12 and 13; 13 adds the edges' data before their count)."""
    query = getattr(cu, "cuStreamGetCaptureInfo", None)
    info: tuple[Any, ...] = tuple(query(stream)) if query is not None else ()
    if len(info) < 6:  # CUDA 11's form, without the graph and its dependencies
        query = getattr(cu, "cuStreamGetCaptureInfo_v2", None)
        info = tuple(query(stream)) if query is not None else ()
    if len(info) < 6 or info[0] != cu.CUresult.CUDA_SUCCESS:  # type: ignore[attr-defined]
        raise Unavailable(f"cuStreamGetCaptureInfo gave {info[0] if info else 'nothing'}")
    deps = list(info[4] or ())
    if len(deps) != 1:
        raise Unavailable(f"a captured launch left {len(deps)} dependencies, not its node")
    return deps[0]


class DirectGraph:
    """The executor's plan (every step a kernel) as one graph whose kernel nodes can be
    pointed at other memory for the inputs and outputs, and its status words' copy."""

    def __init__(self, ex: CudaExecutor) -> None:
        self._ex = ex
        cu = ex.cu
        steps = ex.plan.steps
        self._users: dict[int, list[int]] = {}  # buffer id -> the kernel steps that use it
        for i, st in enumerate(steps):
            assert isinstance(st, KernelStep), "only a plan of kernels has a graph"
            for b in (*st.inputs, *st.outputs):
                self._users.setdefault(b, []).append(i)
        self._nodes: list[Handle] = []
        # buffer id -> the memory its kernels use now, where not the arena's; None: unknown
        # (a re-pointing that failed half-way), so the next run re-points every node
        self._where: dict[int, int] | None = {}
        self._source: Handle | None = None
        self.exec: Handle | None = None
        mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        ex._check(cu.cuStreamBeginCapture(ex.stream, mode), "cuStreamBeginCapture")
        try:
            try:
                for i, st in enumerate(steps):
                    launch = ex._launches[i]
                    assert launch is not None and isinstance(st, KernelStep)
                    ex._start(launch, st.kernel)
                    self._nodes.append(_captured_node(cu, ex.stream))
                ex._status_to_host()
            finally:  # the capture ends whatever happened
                self._source = ex._check(cu.cuStreamEndCapture(ex.stream), "cuStreamEndCapture")
            self.exec = ex._check(cu.cuGraphInstantiate(self._source, 0), "cuGraphInstantiate")
        except BaseException:
            self.destroy()
            raise

    def pointer(self, b: int) -> int | None:
        """The memory buffer ``b``'s kernels use now, where it is not the arena's."""
        return self._where.get(b) if self._where is not None else None

    def pointers(self) -> dict[int, int] | None:
        """The pointers the kernels use now (buffer id -> memory, where not the arena's),
        a new object after every re-pointing: a ``SteadyRun`` holds it to know its graph
        is as it left it."""
        return self._where

    def launch(self, where: Mapping[int, int]) -> None:
        """Point the kernels at ``where`` (buffer id -> device memory; every other buffer
        where the arena has it) and launch the graph on the executor's stream."""
        ex = self._ex
        now = self._where
        if now == where:  # the common case: the same tensors as the last run
            ex._check(ex.cu.cuGraphLaunch(self.exec, ex.stream), "cuGraphLaunch")
            return
        if now is None:
            changed: set[int] = set(self._users)
        else:
            changed = {b for b in now.keys() | where.keys() if now.get(b) != where.get(b)}
        steps = sorted({i for b in changed for i in self._users.get(b, ())})
        self._where = None
        for i in steps:
            step = ex.plan.steps[i]
            assert isinstance(step, KernelStep)
            self._point(i, ex._launch_args(i, step, where), step.kernel)
        self._where = dict(where)
        ex._check(ex.cu.cuGraphLaunch(self.exec, ex.stream), "cuGraphLaunch")

    def _point(self, i: int, launch: KernelLaunch, kernel: str) -> None:
        cu = self._ex.cu
        params = cu.CUDA_KERNEL_NODE_PARAMS()
        params.func = launch.fn
        params.gridDimX, params.gridDimY, params.gridDimZ = launch.grid
        params.blockDimX, params.blockDimY, params.blockDimZ = launch.block
        params.sharedMemBytes = launch.smem
        params.kernelParams = launch.args
        self._ex._check(cu.cuGraphExecKernelNodeSetParams(self.exec, self._nodes[i], params),
                        f"pointing {kernel} (step {i}) at the run's tensors")

    def destroy(self) -> None:
        """Release the graphs (the executor's lock held, its context current, its stream idle)."""
        cu = self._ex.cu
        if self.exec is not None:
            cu.cuGraphExecDestroy(self.exec)
        if self._source is not None:
            cu.cuGraphDestroy(self._source)
        self.exec = self._source = None
        if self._nodes:
            self._nodes = []


def run_direct(ex: CudaExecutor, feeds: Mapping[str, np.ndarray | DeviceView], outputs: Sequence[str],
               wait: bool = True) -> list[np.ndarray | DeviceArray]:
    """A run whose kernels read the GPU feeds where they are and write each output into
    its DeviceArray's memory (the lock held, the context current); memory they may not
    use so (unaligned, or an output over a feed), host feeds and outputs no kernel
    writes are copied, as ``run`` copies everything otherwise.

    Not waited for (``wait=False``, every feed a device tensor that names its stream:
    torch's, a ``__cuda_array_interface__`` v3 one): each feed's stream is made to wait
    for the run, so work the caller queues there after ``run`` returns (reading the
    outputs, or writing memory a feed held once the caller lets it go) comes after the
    run; an index error it finds is raised by the next run that looks (its event
    done), waits, or by ``synchronize``."""
    cu, direct = ex.cu, ex._direct
    assert direct is not None
    views = [a for a in feeds.values() if isinstance(a, DeviceView)]
    ex._order_after(views)
    where: dict[int, int] = {}  # buffer id -> the memory the kernels use for it this run
    held: list[np.ndarray] = []  # host feeds, alive until the stream is done
    spans: list[tuple[int, int]] = []  # the device feeds' memory
    for name, a in feeds.items():
        b = ex._inputs[name]
        if not isinstance(a, DeviceView):
            held.append(np.ascontiguousarray(a))
            ex._h2d(ex.ptr[b], held[-1])
            continue
        nbytes = a.nbytes
        if not nbytes:
            continue
        spans.append((a.ptr, a.ptr + nbytes))
        if in_place(a.ptr):
            where[b] = a.ptr
        else:
            ex._check(cu.cuMemcpyDtoDAsync(ex.ptr[b], a.ptr, nbytes, ex.stream), f"copying input {name}")
    results: list[np.ndarray | DeviceArray] = []
    copies: list[tuple[int, int, int, str]] = []  # (output memory, buffer id, bytes, name)
    for name in outputs:
        b, nbytes, dtype, shape = ex._output_specs[name]
        ptr = ex._output_memory(nbytes, direct.pointer(b))
        results.append(DeviceArray(ptr, dtype, shape, ex, ex.device))
        if nbytes and b in ex._written and b not in where and in_place(ptr) \
                and not any(ptr < end and start < ptr + nbytes for start, end in spans):
            where[b] = ptr
        elif nbytes:
            copies.append((ptr, b, nbytes, name))
    ex._steady = None
    direct.launch(where)
    for ptr, b, nbytes, name in copies:  # from where the run left it
        ex._check(cu.cuMemcpyDtoDAsync(ptr, where.get(b, ex.ptr[b]), nbytes, ex.stream), f"copying output {name}")
    if wait or held or any(v.ready != "stream" for v in views):
        ex._waited()  # (the graph copied the status words)
        if not copies and not held:  # a run the next one with these tensors can repeat
            read = {n for n, a in feeds.items() if isinstance(a, DeviceView) and where.get(ex._inputs[n]) == a.ptr}
            ex._steady = SteadyRun.of(feeds, read, list(outputs), int(ex.feed_device.stream or 0), results,
                                      direct.pointers())
        return results
    streams = {v.stream for v in views}
    ex._check(cu.cuEventRecord(ex._done_event, ex.stream), "recording the run's end")
    for stream in streams:
        ex._check(cu.cuStreamWaitEvent(cu.CUstream(stream), ex._done_event, 0), "ordering the run's outputs")
    ex._unwaited = True
    return results
