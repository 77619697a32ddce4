"""A waited ``run()`` on the same GPU tensors as the run before: launch and wait only.

A server that takes its feeds from torch's caching allocator and drops each run's outputs
hands ``run()`` the same addresses, dtypes and shapes run after run, and the pool gives
each output its block back (``runtime/cuda.py``). The full path still reads every feed
through ``FeedChecker``, makes its views, asks the pool, compares the direct graph's
pointers and only then launches: on the H200 that Python was most of the 46 us a waited
bert-base run added to its graph (benchmarks/gpu_run_overhead.py).

After a run that copied nothing (every feed a torch CUDA tensor read in place, every
output written in place into its own block), the executor keeps a ``SteadyRun``: each
feed's tensor type, dtype, shape and address, torch's stream, each output's block, and the
direct graph's pointers as they were. A later waited run whose feeds match it exactly
(a few torch calls per tensor: the same checks ``FeedChecker`` makes, against the values
it accepted), whose output blocks are free again and whose graph still points there
launches the graph and waits. Anything else (a new address or shape, a view, another
stream, an output still held, a run not waited for in flight) returns None before
anything is changed, and the full path runs, which may keep a new ``SteadyRun``.
"""
from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from tilefuse.feeds import DeviceView
from tilefuse.runtime.device_array import DeviceArray
from tilefuse.torch_feeds import CU_STREAM_LEGACY, is_torch_cuda

if TYPE_CHECKING:
    from tilefuse.runtime.cuda import CudaExecutor


class SteadyRun:
    """What a run that copied nothing read and wrote, to repeat it on the same memory."""

    __slots__ = ("names", "feeds", "tensor_type", "index", "raw_stream", "current", "order", "outputs", "where")

    def __init__(self, feeds: Sequence[tuple[str, Any, int]], names: list[str], raw_stream: Callable[[int], int],
                 ours: int, outputs: Sequence[DeviceArray], where: object) -> None:
        self.names = names
        # (name, torch dtype, torch shape, address) of each feed, in the plan's order
        self.feeds = tuple((name, t.dtype, t.shape, ptr) for name, t, ptr in feeds)
        first = feeds[0][1]
        self.tensor_type, self.index, self.raw_stream = type(first), first.get_device(), raw_stream
        # torch's current stream then; the plan's stream waits for it unless it is the
        # plan's own or the legacy default stream (the plan's stream is a blocking one)
        self.current = int(raw_stream(self.index)) or CU_STREAM_LEGACY
        self.order = self.current not in (ours, CU_STREAM_LEGACY)
        # (block, bytes, dtype, shape) of each output, in ``names``' order
        self.outputs = tuple((a.ptr, a.nbytes, a.dtype, a.shape) for a in outputs)
        self.where = where  # the direct graph's pointers then (compared by identity)

    @classmethod
    def of(cls, views: Mapping[str, object], in_place: set[str], names: list[str], ours: int,
           outputs: Sequence[object], where: object) -> SteadyRun | None:
        """The record of a run that read ``views`` (its feeds; ``in_place``: those read
        where they are) and wrote ``outputs`` in place, or None where a later run could
        not repeat it by launching alone: a feed that is not a torch CUDA tensor read in
        place, an empty tensor, or a torch without its raw current-stream call."""
        feeds = []
        for name, v in views.items():
            if not isinstance(v, DeviceView) or name not in in_place or not v.nbytes or not is_torch_cuda(v.keep) \
                    or v.ready not in ("ordered", "stream"):
                return None
            feeds.append((name, v.keep, v.ptr))
        arrays = [a for a in outputs if isinstance(a, DeviceArray) and a.nbytes]
        if not feeds or not arrays or len(arrays) != len(outputs):
            return None
        torch = sys.modules[type(feeds[0][1]).__module__.partition(".")[0]]
        raw = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None)
        return None if raw is None else cls(feeds, names, raw, ours, arrays, where)

    def _same(self, feeds: object, names: object) -> bool:
        """Whether ``feeds`` are the recorded tensors as they were (type, address, dtype,
        shape, device, contiguous, no negative view), on the same stream, for the same
        outputs: ``FeedChecker``'s checks against the values it accepted."""
        if type(feeds) is not dict or names != self.names or len(feeds) != len(self.feeds):
            return False  # (other mappings, and anything else, go the full way)
        kind, index = self.tensor_type, self.index
        for name, dtype, shape, ptr in self.feeds:
            t: Any = feeds.get(name)
            if type(t) is not kind or t.data_ptr() != ptr or t.dtype is not dtype or t.shape != shape \
                    or t.get_device() != index or not t.is_contiguous() or t.is_neg():
                return False
        return (int(self.raw_stream(index)) or CU_STREAM_LEGACY) == self.current

    def run(self, ex: CudaExecutor, feeds: object, names: object) -> list[DeviceArray] | None:
        """The outputs of the plan run again on the recorded memory and waited for, or None
        (nothing done) where this record does not describe the run asked for. The feeds
        are read without the executor's lock (they are the caller's), the rest under it:
        a session closing waits for the lock, and a closed executor is not run. Only what
        the launch depends on comes before it; the outputs' arrays are made while the
        graph runs (work before the launch is time a caller waits for in full)."""
        if not self._same(feeds, names):
            return None
        cu = ex.cu
        with ex._lock:
            direct = ex._direct
            if ex._closed or ex._unwaited or direct is None or direct.pointers() is not self.where:
                return None
            spare = ex._spare
            for ptr, nbytes, _, _ in self.outputs:
                free = spare.get(nbytes)
                if not free or ptr not in free:
                    return None
            for ptr, nbytes, _, _ in self.outputs:
                spare[nbytes].remove(ptr)
            try:
                ex._check(cu.cuCtxSetCurrent(ex.ctx), "cuCtxSetCurrent")
                if self.order:  # a stream of the caller's: the run comes after its work
                    ex._check(cu.cuEventRecord(ex._feed_event, cu.CUstream(self.current)), "recording a feed's stream")
                    ex._check(cu.cuStreamWaitEvent(ex.stream, ex._feed_event, 0), "waiting for a feed's stream")
                ex._check(cu.cuGraphLaunch(direct.exec, ex.stream), "cuGraphLaunch")
            except BaseException:
                for ptr, nbytes, _, _ in self.outputs:  # nothing launched: the blocks stay free
                    spare[nbytes].append(ptr)
                raise
            results = []
            for ptr, nbytes, dtype, shape in self.outputs:
                ex._sizes[ptr] = nbytes
                ex._outstanding += 1
                results.append(DeviceArray.made(ptr, dtype, shape, ex, ex.device))
            ex._waited()
            return results
