"""A stand-in for cuda.bindings.driver, and a plan for it: "device" memory is host memory,
copies are memmove, a CUDA graph replays the copies and launches it captured (its kernel
nodes can be re-pointed), and each "kernel" is a Python gather that behaves as tilefuse's
do (tf_index in codegen/cuda/include/tilefuse_index.cuh: a bad index reads row 0 and claims
the status word). The GPU machine runs real kernels."""
import ctypes
import hashlib
from types import SimpleNamespace

import numpy as np

from tilefuse.codegen.artifact import ParamSpec
from tilefuse.codegen.launch import CudaLaunch, KernelArg
from tilefuse.ir import DType, TensorType
from tilefuse.plan.model import Binding, Buffer, BufferKind, IndexSite, Kernel, KernelStep, Plan

ROWS, COLS, N = 10, 3, 4
SITES = ("input 'ids' (the indices of Gather node 'emb')", "input 'ids' (the indices of Gather node 'emb2')")


def view(ptr: int, dtype, shape) -> np.ndarray:
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
        self.calls: list[tuple] = []  # synchronisations, event records and waits, in order
        self.repointed: list[int] = []  # kernel nodes given new arguments, by index in their graph

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
        """Not zeroed and aligned to 256 bytes, as on a GPU (cuMemAlloc gives 512)."""
        self.blocks.append((ctypes.c_char * (nbytes + 256))(*([b"\xab"] * (nbytes + 256))))
        start = ctypes.addressof(self.blocks[-1])
        return (0, start + (-start % 256))

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

    def cuStreamSynchronize(self, stream):
        self.calls.append(("sync", stream))
        return (0,)

    def cuCtxSynchronize(self):
        self.calls.append(("sync", "device"))
        return (0,)

    def CUstream(self, handle): return handle

    def cuStreamWaitEvent(self, stream, event, flags):
        self.calls.append(("wait", stream, event))
        return (0,)

    busy = False  # set by a test: events read as not yet reached (the driver's CUDA_ERROR_NOT_READY)

    def cuEventQuery(self, event): return (600,) if self.busy else (0,)  # the stand-in runs everything at once
    def cuStreamBeginCapture(self, stream, mode):
        self.capturing = []
        return (0,)

    def cuStreamEndCapture(self, stream):
        self.graphs.append(self.capturing)
        self.capturing = None
        return (0, len(self.graphs) - 1)

    def cuGraphInstantiate(self, graph, flags): return (0, graph)

    class CUDA_KERNEL_NODE_PARAMS(SimpleNamespace):
        pass

    def cuStreamGetCaptureInfo(self, stream):
        """CUDA 13's form: (result, status, id, graph, dependencies, edge data, count); the
        dependency after a launch is its node, here its index in the captured list."""
        assert self.capturing is not None
        return (0, 1, 0, len(self.graphs), [len(self.capturing) - 1], [None], 1)

    def cuGraphExecKernelNodeSetParams(self, exec_, node, params):
        op = self.graphs[exec_][node]
        assert op[0] == "launch" and op[1] == params.func, "a kernel node keeps its function"
        self.graphs[exec_][node] = ("launch", params.func, tuple(params.kernelParams[0]))
        self.repointed.append(node)
        return (0,)

    def cuGraphLaunch(self, exec_, stream):
        for op in self.graphs[exec_]:
            self._do(op)
        return (0,)

    def cuEventCreate(self, flags):
        self.events = getattr(self, "events", 0) + 1
        return (0, f"event{self.events}")
    def cuEventRecord(self, event, stream):
        self.calls.append(("record", event, stream))
        return (0,)
    def cuEventSynchronize(self, event): return (0,)
    def cuEventElapsedTime(self, start, stop): return (0, 0.5)

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, smem, stream, args, extra):
        self._do(("launch", fn, args[0]))
        return (0,)

    def _run(self, fn, pointers):
        ids_p, table_p, out_p, status_p = pointers
        self.launched.append((fn, pointers))
        ids, table = view(ids_p, np.int64, (N,)), view(table_p, np.float32, (ROWS, COLS))
        out, status = view(out_p, np.float32, (N, COLS)), view(status_p, np.int64, (2,))
        for i, x in enumerate(ids):
            w = x + ROWS if x < 0 else x
            if not 0 <= w < ROWS:
                if status[0] == 0:
                    status[0], status[1] = 1, x  # site 0
                w = 0
            out[i] = table[w]


def gather_plan(tmp_path) -> Plan:
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



def caller_memory(ctype, n: int, aligned: bool):
    """``n`` elements of the caller's "device" memory, at an address aligned to 256 bytes
    or deliberately not (8 past it)."""
    raw = (ctypes.c_char * (n * ctypes.sizeof(ctype) + 512))()
    start = ctypes.addressof(raw)
    at = start + (-start % 256) + (0 if aligned else 8)
    return raw, (ctype * n).from_address(at)


