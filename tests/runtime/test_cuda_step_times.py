"""A CUDA profile's run (``CudaExecutor.step_times``) against a recording driver, so that
it is checked where there is no GPU: the steps are launched one by one (never the graph),
each kernel and select between two events of its own, a host step timed on the host once
the stream is idle; each step's time is its own events' interval; every event is
destroyed. The GPU machine runs it for real (`tilefuse profile` on a cuda plan)."""
from __future__ import annotations

import ctypes
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from tilefuse.ir import DType, TensorType
from tilefuse.plan import BranchStep, HostStep, KernelStep, SelectStep
from tilefuse.runtime.cuda import CudaExecutor
from tilefuse.runtime.cuda_launch import KernelLaunch


class Driver:
    """Records what the executor asks for; event k's time is 10 * k ms."""

    CUresult = SimpleNamespace(CUDA_SUCCESS=0)

    def __init__(self, flag: np.ndarray) -> None:
        self.calls: list[tuple] = []
        self.flag = flag
        self.events: list[int] = []
        self.destroyed: list[int] = []

    def cuCtxSetCurrent(self, ctx):
        return (0,)

    def cuEventCreate(self, flags):
        self.events.append(len(self.events))
        return (0, self.events[-1])

    def cuEventDestroy(self, event):
        self.destroyed.append(event)
        return (0,)

    def cuEventRecord(self, event, stream):
        self.calls.append(("record", event))
        return (0,)

    def cuEventElapsedTime(self, start, stop):
        return (0, 10.0 * stop - 10.0 * start)

    def cuLaunchKernel(self, fn, *args):
        self.calls.append(("launch", fn))
        return (0,)

    def cuGraphLaunch(self, graph, stream):  # never: a profile launches step by step
        self.calls.append(("graph",))
        return (0,)

    def cuStreamSynchronize(self, stream):
        self.calls.append(("wait",))
        return (0,)

    def cuMemcpyHtoDAsync(self, dst, src, nbytes, stream):
        self.calls.append(("upload", hex(dst)))
        return (0,)

    def cuMemcpyDtoHAsync(self, dst, src, nbytes, stream):
        if src == 0x100:  # the condition
            self.calls.append(("read condition",))
            ctypes.memmove(dst, self.flag.ctypes.data, nbytes)
        else:
            self.calls.append(("download", hex(src)))
        return (0,)

    def cuMemcpyDtoDAsync(self, dst, src, nbytes, stream):
        self.calls.append(("copy", hex(src), hex(dst)))
        return (0,)


def _executor(driver: Driver, steps: list) -> CudaExecutor:
    f32 = TensorType(DType.FLOAT32, (2, 3))
    buffers = [SimpleNamespace(name="c", type=TensorType(DType.BOOL, ()), nbytes=1)] + [
        SimpleNamespace(name=n, type=f32, nbytes=24) for n in ("t", "e", "y", "x", "h")]
    ex = object.__new__(CudaExecutor)
    ex.cu, ex.stream, ex.ctx = driver, 7, 1
    ex._lock = threading.RLock()
    ex.ptr = {i: 0x100 * (i + 1) for i in range(len(buffers))}
    ex.plan = SimpleNamespace(steps=steps, buffers=buffers)
    ex._inputs = {"x": 4}
    ex._checked, ex._status, ex._status_ptr = [], np.zeros((0, 2), np.int64), 0
    ex._graph = "a graph that must not be launched"
    ex._launches = [KernelLaunch(f"fn_{s.kernel}", (1, 1, 1), (32, 1, 1), 0, ((), ()), [], None)
                    if isinstance(s, KernelStep) else None for s in steps]
    return ex


@pytest.mark.parametrize("cond", [True, False])
def test_each_launch_between_its_own_events(cond):
    driver = Driver(np.array([cond]))
    steps = [KernelStep("k0", (4,), (0,), 0), BranchStep(0, 1, 1, 1, "if"), KernelStep("k1", (), (1,), 0),
             KernelStep("k2", (), (2,), 0), SelectStep(0, (1,), (2,), (3,), 1, "if"), KernelStep("k3", (3,), (), 2)]
    ex = _executor(driver, steps)
    times = ex.step_times({"x": np.ones((2, 3), np.float32)})
    taken = 2 if cond else 3
    assert [i for i, _ in times] == [0, taken, 4, 5]
    # event 2i starts step i, 2i + 1 ends it: each interval is 10 ms here
    assert all(seconds == pytest.approx(0.010) for _, seconds in times)
    source = "0x200" if cond else "0x300"
    assert driver.calls == [
        ("upload", "0x500"),
        ("record", 0), ("launch", "fn_k0"), ("record", 1),
        ("read condition",), ("wait",),
        ("record", 2 * taken), ("launch", f"fn_k{taken - 1}"), ("record", 2 * taken + 1),
        ("read condition",), ("wait",), ("record", 8), ("copy", source, "0x400"), ("record", 9),
        ("record", 10), ("launch", "fn_k3"), ("record", 11),
        ("wait",),
    ]
    assert sorted(driver.destroyed) == driver.events and len(driver.events) == 2 * len(steps)


def test_a_host_step_waits_for_the_stream_then_runs_on_a_host_timer(monkeypatch):
    driver = Driver(np.array([True]))
    prim = SimpleNamespace(name="TopK", evaluate=lambda args: [args[0] * 2])
    steps = [KernelStep("k0", (4,), (1,), 0), HostStep(prim, (1,), (5,), 1, "topk"), KernelStep("k1", (5,), (3,), 2)]
    ex = _executor(driver, steps)
    times = ex.step_times({"x": np.ones((2, 3), np.float32)})
    assert [i for i, _ in times] == [0, 1, 2]
    assert times[0][1] == pytest.approx(0.010) and times[2][1] == pytest.approx(0.010)
    assert 0 < times[1][1] < 5  # a host timer's seconds, not an event interval
    assert driver.calls == [
        ("upload", "0x500"),
        ("record", 0), ("launch", "fn_k0"), ("record", 1),
        ("wait",),  # before the host step's timer starts: the kernels before it are not its time
        ("download", "0x200"), ("wait",), ("upload", "0x600"), ("wait",),
        ("record", 4), ("launch", "fn_k1"), ("record", 5),
        ("wait",),
    ]
