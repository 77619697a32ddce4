"""The CUDA runtime's status words (kernels that check indices), against a stand-in
driver: "device" memory is host memory, copies are memmove, the CUDA graph replays the
launches it captured, and each "kernel" is a Python gather that behaves as tilefuse's do
(tf_index in codegen/cuda/include/tilefuse_index.cuh: a bad index reads row 0 and claims
the status word). The GPU machine runs real kernels: tools/gpu_index_check.py."""
import ctypes
import hashlib
from types import SimpleNamespace

import numpy as np
import pytest

from tilefuse.codegen.artifact import ParamSpec
from tilefuse.codegen.launch import CudaLaunch, KernelArg
from tilefuse.errors import ExecutionError
from tilefuse.ir import DType, TensorType
from tilefuse.plan.model import Binding, Buffer, BufferKind, IndexSite, Kernel, KernelStep, Plan
from tilefuse.runtime import cuda as cuda_runtime
from tilefuse.runtime.session import InferenceSession

ROWS, COLS, N = 10, 3, 4
SITES = ("input 'ids' (the indices of Gather node 'emb')", "input 'ids' (the indices of Gather node 'emb2')")


def _view(ptr: int, dtype, shape) -> np.ndarray:
    n = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.frombuffer((ctypes.c_char * n).from_address(ptr), dtype=dtype).reshape(shape)


class Driver:
    """Enough of cuda.bindings.driver for CudaExecutor, recording what it is asked."""

    CUresult = SimpleNamespace(CUDA_SUCCESS=0)
    CUstreamCaptureMode = SimpleNamespace(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL=1)
    CUevent_flags = SimpleNamespace(CU_EVENT_DISABLE_TIMING=2)  # the feed-ordering event's

    def __init__(self) -> None:
        self.blocks: list[ctypes.Array] = []
        self.capturing: list | None = None
        self.graph: list = []
        self.launched: list[tuple] = []  # (function, pointer arguments)

    def cuInit(self, flags): return (0,)
    def cuDeviceGet(self, ordinal): return (0, ordinal)
    def cuDevicePrimaryCtxRetain(self, dev): return (0, "ctx")
    def cuCtxSetCurrent(self, ctx): return (0,)
    def cuStreamCreate(self, flags): return (0, 7)
    def cuStreamDestroy(self, stream): return (0,)
    def cuDevicePrimaryCtxRelease(self, dev): return (0,)
    def cuModuleUnload(self, module): return (0,)
    def cuMemFree(self, ptr): return (0,)
    def cuGraphExecDestroy(self, exec_): return (0,)
    def cuGraphDestroy(self, graph): return (0,)
    def cuEventDestroy(self, event): return (0,)
    def cuGetErrorName(self, err): return (0, b"CUDA_ERROR_FAKE")
    def cuModuleLoadData(self, image): return (0, "module")
    def cuModuleGetFunction(self, module, name): return (0, name.decode())

    def cuMemAlloc(self, nbytes):
        self.blocks.append((ctypes.c_char * nbytes)(*([b"\xab"] * nbytes)))  # not zeroed, as on a GPU
        return (0, ctypes.addressof(self.blocks[-1]))

    def cuMemcpyHtoDAsync(self, dst, src, nbytes, stream):
        ctypes.memmove(dst, src, nbytes)
        return (0,)

    cuMemcpyDtoHAsync = cuMemcpyHtoDAsync

    def cuStreamSynchronize(self, stream): return (0,)
    def cuStreamBeginCapture(self, stream, mode):
        self.capturing = []
        return (0,)

    def cuStreamEndCapture(self, stream):
        self.graph, self.capturing = self.capturing, None
        return (0, "graph")

    def cuGraphInstantiate(self, graph, flags): return (0, "exec")

    def cuGraphLaunch(self, exec_, stream):
        for launch in self.graph:
            self._run(*launch)
        return (0,)

    def cuEventCreate(self, flags): return (0, "event")
    def cuEventRecord(self, event, stream): return (0,)
    def cuEventSynchronize(self, event): return (0,)
    def cuEventElapsedTime(self, start, stop): return (0, 0.5)

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, smem, stream, args, extra):
        (self.capturing.append if self.capturing is not None else lambda x: self._run(*x))((fn, args[0]))
        return (0,)

    def _run(self, fn, pointers):
        ids_p, table_p, out_p, status_p = pointers
        self.launched.append((fn, pointers))
        ids, table = _view(ids_p, np.int64, (N,)), _view(table_p, np.float32, (ROWS, COLS))
        out, status = _view(out_p, np.float32, (N, COLS)), _view(status_p, np.int64, (2,))
        for i, x in enumerate(ids):
            w = x + ROWS if x < 0 else x
            if not 0 <= w < ROWS:
                if status[0] == 0:
                    status[0], status[1] = 1, x  # site 0
                w = 0
            out[i] = table[w]


def _plan(tmp_path) -> Plan:
    """ids -> two gathers from the table, each a kernel step that checks its indices."""
    image = tmp_path / "k.cubin"
    image.write_bytes(b"\x7fELF fake")
    ids, table = TensorType(DType.INT64, (N,)), TensorType(DType.FLOAT32, (ROWS, COLS))
    out = TensorType(DType.FLOAT32, (N, COLS))
    buffers = (Buffer(0, "ids", BufferKind.INPUT, ids), Buffer(1, "table", BufferKind.CONSTANT, table),
               Buffer(2, "y", BufferKind.OUTPUT, out, 0), Buffer(3, "y2", BufferKind.OUTPUT, out, 64))
    params = (ParamSpec("in0", "int64", (N,), "input"), ParamSpec("in1", "float32", (ROWS, COLS), "input"),
              ParamSpec("out0", "float32", (N, COLS), "output"), ParamSpec("status", "int64", (2,), "status"))
    name = "gather_0123456789"  # a generated name's form: the runtime calls only NAME_kernel in it
    launch = CudaLaunch(f"{name}_kernel", (1, 1, 1), (32, 1, 1), tuple(KernelArg(p.name, i) for i, p in enumerate(params)))
    kernel = Kernel(name, f"{name}_kernel", image, hashlib.sha256(image.read_bytes()).hexdigest(), launch, params)
    steps = (KernelStep(name, (0, 1), (2,), 0, (IndexSite(SITES[0], ROWS),)),
             KernelStep(name, (0, 1), (3,), 1, (IndexSite(SITES[1], ROWS),)))
    weights = {"table": np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)}
    return Plan("cuda:sm_90a", "", "test", buffers, (Binding("ids", 0),), (Binding("y", 2), Binding("y2", 3)),
                {name: kernel}, steps, 128, weights)


@pytest.fixture
def session(tmp_path, monkeypatch):
    driver = Driver()
    monkeypatch.setattr(cuda_runtime, "_driver", lambda: driver)
    return InferenceSession(_plan(tmp_path)), driver


def test_each_checking_step_gets_its_own_zeroed_status_word(session):
    sess, driver = session
    ids = np.array([3, -1, 0, 9], np.int64)
    y, y2 = sess.run(None, {"ids": ids})
    table = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)
    np.testing.assert_array_equal(y, table[ids])
    np.testing.assert_array_equal(y2, table[ids])
    (_, first), (_, second) = driver.launched
    assert second[3] == first[3] + 16  # one word each, side by side, apart from every buffer
    assert first[3] not in first[:3] and first[:2] == second[:2] and first[2] != second[2]
    assert _view(first[3], np.int64, (4,)).tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("bad", [10, -11, 2**40, -2**63])
def test_a_bad_index_fails_the_run_with_the_first_steps_message_and_is_cleared(session, bad):
    sess, driver = session
    with pytest.raises(ExecutionError) as e:
        sess.run(None, {"ids": np.array([1, bad, 2, 3], np.int64)})
    assert str(e.value) == f"index {bad} is outside [-10, 10) in {SITES[0]}"  # both steps found it: the first
    words = driver.launched[0][1][3]
    assert _view(words, np.int64, (4,)).tolist() == [0, 0, 0, 0]  # cleared on the device for the next run
    y, _ = sess.run(None, {"ids": np.array([1, 2, 3, 4], np.int64)})
    np.testing.assert_array_equal(y[:, 0], [3, 6, 9, 12])


def test_timing_runs_do_not_leave_a_bad_index_for_the_next_run(session):
    """Tools time the plan on whatever inputs were copied in last (timed does not read the
    status words): after timing bad ids, a run with good ones succeeds."""
    sess, driver = session
    with pytest.raises(ExecutionError):
        sess.run(None, {"ids": np.array([1, 99, 2, 3], np.int64)})
    assert sess._executor.timed(3) == [0.5, 0.5, 0.5]  # the bad ids again, three times
    y, _ = sess.run(None, {"ids": np.array([1, 2, 3, 4], np.int64)})
    np.testing.assert_array_equal(y[:, 0], [3, 6, 9, 12])
