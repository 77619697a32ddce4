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
        self.graphs: list[list] = []  # each captured graph's copies and launches, in order
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

    def cuMemHostAlloc(self, nbytes, flags):
        self.blocks.append((ctypes.c_char * nbytes)(*([b"\xcd"] * nbytes)))  # page-locked host memory
        return (0, ctypes.addressof(self.blocks[-1]))

    def cuMemFreeHost(self, ptr): return (0,)

    def cuMemcpyHtoDAsync(self, dst, src, nbytes, stream):
        self._do(("copy", dst, src, nbytes))
        return (0,)

    cuMemcpyDtoHAsync = cuMemcpyDtoDAsync = cuMemcpyHtoDAsync

    def _do(self, op):
        """A copy or a launch: recorded while a stream is captured, else done now."""
        if self.capturing is not None:
            self.capturing.append(op)
        elif op[0] == "copy":
            ctypes.memmove(*op[1:])
        else:
            self._run(*op[1:])

    def cuStreamSynchronize(self, stream): return (0,)
    def cuStreamBeginCapture(self, stream, mode):
        self.capturing = []
        return (0,)

    def cuStreamEndCapture(self, stream):
        self.graphs.append(self.capturing)
        self.capturing = None
        return (0, len(self.graphs) - 1)

    def cuGraphInstantiate(self, graph, flags): return (0, graph)

    def cuGraphLaunch(self, exec_, stream):
        for op in self.graphs[exec_]:
            self._do(op)
        return (0,)

    def cuEventCreate(self, flags): return (0, "event")
    def cuEventRecord(self, event, stream): return (0,)
    def cuEventSynchronize(self, event): return (0,)
    def cuEventElapsedTime(self, start, stop): return (0, 0.5)

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, smem, stream, args, extra):
        self._do(("launch", fn, args[0]))
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


def _caller_memory(ctype, n: int, aligned: bool):
    """``n`` elements of the caller's "device" memory, at an address aligned to 256 bytes
    or deliberately not (8 past it)."""
    raw = (ctypes.c_char * (n * ctypes.sizeof(ctype) + 512))()
    start = ctypes.addressof(raw)
    at = start + (-start % 256) + (0 if aligned else 8)
    return raw, (ctype * n).from_address(at)


@pytest.mark.parametrize("aligned", [True, False], ids=["in-place", "copied"])
def test_a_binding_runs_one_graph_on_the_bound_memory_and_checks_indices(session, aligned):
    """Buffers bound once (CudaExecutor.bind): each run is one graph launch. Aligned bound
    memory is used by the kernels in place (they read the ids and write y where the caller
    has them); unaligned memory is copied in and out inside the graph. y2, bound to memory
    the binding owns, the same. The status words go to page-locked memory; a bad index
    written into the bound input later fails that run with the message and is cleared;
    the next good run succeeds."""
    from tilefuse.feeds import DeviceView

    sess, driver = session
    ex = sess._executor
    keep_ids, ids_dev = _caller_memory(ctypes.c_int64, N, aligned)  # "device" memory of the caller's
    keep_y, y_dev = _caller_memory(ctypes.c_float, N * COLS, aligned)
    ids_dev[:] = [3, -1, 0, 9]
    bound = ex.bind({"ids": DeviceView(ctypes.addressof(ids_dev), np.dtype(np.int64), (N,), ready="ready")},
                    {"y": DeviceView(ctypes.addressof(y_dev), np.dtype(np.float32), (N, COLS), ready="ready"), "y2": None})
    table = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)
    graph = driver.graphs[-1]
    own_y2 = bound.outputs[1].ptr % 256 == 0
    ops = [op[0] for op in graph]
    if aligned:
        assert ops == ["launch", "launch"] + ["copy"] * (1 + (not own_y2))
        assert graph[0][2][0] == ctypes.addressof(ids_dev) and graph[0][2][2] == ctypes.addressof(y_dev)
    else:
        assert ops == ["copy", "launch", "launch", "copy"] + ["copy"] * (1 + (not own_y2))
    launched = len(driver.launched)
    bound.run()
    assert len(driver.launched) == launched + 2
    np.testing.assert_array_equal(_view(ctypes.addressof(y_dev), np.float32, (N, COLS)), table[[3, -1, 0, 9]])
    assert isinstance(bound.outputs[1], cuda_runtime.DeviceArray)
    np.testing.assert_array_equal(_view(bound.outputs[1].ptr, np.float32, (N, COLS)), table[[3, -1, 0, 9]])
    ids_dev[2] = 2**40
    with pytest.raises(ExecutionError, match=f"index {2**40} is outside"):
        bound.run()
    ids_dev[2] = 1
    bound.run()
    np.testing.assert_array_equal(_view(ctypes.addressof(y_dev), np.float32, (N, COLS))[2], table[1])
    with pytest.raises(Exception, match="stream must be"):
        bound.run(stream="torch")
    sess.close()
    with pytest.raises(ExecutionError, match="closed"):
        bound.run()


def test_bind_checks_what_it_is_given(session):
    from tilefuse.errors import InputError

    sess, _ = session
    with pytest.raises(InputError, match="host arrays; bind GPU tensors"):
        sess.bind({"ids": np.zeros(N, np.int64)})
    with pytest.raises(InputError, match="missing"):
        sess.bind({})
