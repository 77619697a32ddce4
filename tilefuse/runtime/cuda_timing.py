"""Timing a CUDA plan for profiles and benchmarks: events around steps, never in a run.

``step_times`` is a profile's run (``tilefuse profile``, ``InferenceSession.step_times``):
the steps launched one by one, each kernel between two CUDA events of its own, a host step
on a CPU timer. ``timed`` is the device time of whole runs (the graph's replay, or the
steps launched one by one) and ``timed_steps`` each kernel's, launched back to back; both
read whatever the inputs hold. Runs (``CudaExecutor.run``) record no events.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator, Mapping

import numpy as np

from tilefuse.feeds import DeviceView
from tilefuse.plan.model import BranchStep, HostStep, KernelStep, SelectStep, step_order
from tilefuse.runtime.cuda_launch import Handle

if TYPE_CHECKING:
    from tilefuse.runtime.cuda import CudaExecutor


def timed_steps(ex: CudaExecutor, repeats: int) -> list[tuple[str, float]]:
    """(kernel, ms) of every kernel step: CUDA events around ``repeats`` launches of it
    back to back, divided (launch latency overlaps the previous launch, as in a graph,
    where events around one launch would count it whole)."""
    cu = ex.cu
    out = []
    with ex._lock, timing_events(ex) as (start, stop):
        for step, launch in zip(ex.plan.steps, ex._launches):
            if launch is None:
                continue
            assert isinstance(step, KernelStep)  # only kernel steps have launches
            ex._start(launch, step.kernel)
            ex._check(cu.cuEventRecord(start, ex.stream), "cuEventRecord")
            for _ in range(repeats):
                ex._start(launch, step.kernel)
            ex._check(cu.cuEventRecord(stop, ex.stream), "cuEventRecord")
            ex._check(cu.cuEventSynchronize(stop), "cuEventSynchronize")
            out.append((step.kernel, float(ex._check(cu.cuEventElapsedTime(start, stop), "cuEventElapsedTime")) / repeats))
        ex._clear_status()
    return out


@contextmanager
def timing_events(ex: CudaExecutor, n: int = 2) -> Iterator[tuple[Handle, ...]]:
    """``n`` CUDA events for timing, destroyed after (the lock held: the executor is open)."""
    ex._open()
    cu = ex.cu
    ex._check(cu.cuCtxSetCurrent(ex.ctx), "cuCtxSetCurrent")
    events = []
    try:
        for _ in range(n):
            events.append(ex._check(cu.cuEventCreate(0), "cuEventCreate"))
        yield tuple(events)
    finally:
        for event in events:
            cu.cuEventDestroy(event)


def step_times(ex: CudaExecutor, feeds: Mapping[str, np.ndarray | DeviceView]) -> list[tuple[int, float]]:
    """One run for a profile: (step index, seconds) of each step it takes, in order,
    launched one by one on the session's stream, never as the graph. A kernel or select
    step runs between two CUDA events of its own, its time their interval; a host step
    (it waits for its inputs itself) gets a CPU timer once the stream is idle, so that
    it is not charged the kernels before it. The outputs are not read; a bad index is
    the run's error, as in ``run``. Runs do not use it: the graph has no events."""
    cu = ex.cu
    clock = time.perf_counter
    with ex._lock, timing_events(ex, 2 * len(ex.plan.steps)) as events:
        _, held = ex._copy_in(feeds)
        order: list[int] = []
        host: dict[int, float] = {}  # host step -> seconds
        for i in step_order(ex.plan.steps, ex._truth):
            step = ex.plan.steps[i]
            if isinstance(step, BranchStep):
                continue  # it does nothing itself: step_order read its condition
            order.append(i)
            if isinstance(step, HostStep):
                ex._check(cu.cuStreamSynchronize(ex.stream), f"before host step {step.label}")
                t0 = clock()
                ex._host(step)
                host[i] = clock() - t0
                continue
            # a select reads its condition first (a wait): its copies alone are its time
            cond = ex._truth(step) if isinstance(step, SelectStep) else False
            start, stop = events[2 * i], events[2 * i + 1]
            ex._check(cu.cuEventRecord(start, ex.stream), "cuEventRecord")
            if isinstance(step, SelectStep):
                ex._select(step, cond)
            else:
                ex._step(i)
            ex._check(cu.cuEventRecord(stop, ex.stream), "cuEventRecord")
        ex._d2h(ex._status, ex._status_ptr)
        ex._check(cu.cuStreamSynchronize(ex.stream), "running the plan step by step")
        del held  # the input copies are done
        if ex._status.any():
            raise ex._index_error()
        times = []
        for i in order:
            if i in host:
                times.append((i, host[i]))
                continue
            ms = ex._check(cu.cuEventElapsedTime(events[2 * i], events[2 * i + 1]), "cuEventElapsedTime")
            times.append((i, float(ms) / 1e3))
        return times


def timed(ex: CudaExecutor, repeats: int, graph: bool = True) -> list[float]:
    """Device time of ``repeats`` runs of the plan (ms each, CUDA events), as one graph
    launch or step by step; the inputs are whatever a run copied into the plan's input
    buffers last (a host run's; GPU feeds are read where they are, not copied)."""
    cu = ex.cu
    with ex._lock, timing_events(ex) as (start, stop):
        times = []
        for _ in range(repeats):
            ex._check(cu.cuEventRecord(start, ex.stream), "cuEventRecord")
            ex.launch_all() if graph else ex.launch_steps()
            ex._check(cu.cuEventRecord(stop, ex.stream), "cuEventRecord")
            ex._check(cu.cuEventSynchronize(stop), "cuEventSynchronize")
            times.append(float(ex._check(cu.cuEventElapsedTime(start, stop), "cuEventElapsedTime")))
        ex._clear_status()
        return times
