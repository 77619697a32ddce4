"""The CUDA custom op on a GPU machine whose onnxruntime has no CUDA provider.

    python tests/ort/gpu_harness.py build [--models ...] [--dtypes float32 float16]   # here (nvcc, tilelang)
    PYTHONPATH=. python tests/ort/gpu_harness.py run                                   # on the GPU machine

The project's GPU machine has a CPU-only onnxruntime and no network, so a model exported
with ``--target cuda:sm_90a --as custom-ops`` cannot run there inside onnxruntime: its
FusedKernelCuda nodes need the CUDA provider. This harness plays the provider's part of
the custom-op ABI instead, so that the library's CUDA code runs exactly as onnxruntime
would drive it: ``RegisterCustomOps`` with an API table of our own (the slots the library
uses, at their real indexes), ``CreateKernelV2`` with the node's attributes, and
``KernelComputeV2`` with a kernel context whose tensors are device buffers and whose GPU
compute stream is a stream of ours. The graph around the nodes (initializers, Identity)
is walked in order here. Outputs are compared with onnxruntime's (CPU, original model)
on the same inputs, saved at build time.

``build`` writes build/ort_gpu/NAME-DTYPE/ (the export) and NAME-DTYPE.npz.
"""
from __future__ import annotations

import argparse
import ctypes
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent.parent / "build" / "ort_gpu"
sys.path.insert(0, str(ROOT.parent.parent))

# OrtApi slots the library calls (tilefuse/ort/csrc/ort_abi.h).
SLOTS = {
    "CreateStatus": 0, "GetErrorMessage": 2, "CreateCustomOpDomain": 26, "CustomOpDomain_Add": 27,
    "AddCustomOpDomain": 28, "GetTensorMutableData": 51, "GetTensorElementType": 60, "GetDimensionsCount": 61,
    "GetDimensions": 62, "GetTensorTypeAndShape": 65, "KernelInfoGetAttribute_string": 87,
    "KernelContext_GetInputCount": 88, "KernelContext_GetOutputCount": 89, "KernelContext_GetInput": 90,
    "KernelContext_GetOutput": 91, "ReleaseStatus": 93, "ReleaseTensorTypeAndShapeInfo": 99,
    "KernelContext_GetGPUComputeStream": 193, "KernelInfo_GetNodeName": 244,
}
# OrtCustomOp fields, as 8-byte words (the uint32 version is padded to 8)
OP_GET_NAME, OP_GET_PROVIDER, OP_CREATE_KERNEL_V2, OP_COMPUTE_V2, OP_DESTROY = 2, 3, 17, 18, 9

P = ctypes.c_size_t  # pointers returned from callbacks (ctypes leaks c_void_p results)
VP = ctypes.c_void_p
ONNX_TO_NUMPY = {1: np.float32, 10: np.float16, 11: np.float64, 6: np.int32, 7: np.int64, 9: np.bool_}


def build(args) -> int:
    import models
    from models.reference import save_reference
    from tilefuse.ort import export_ort

    ROOT.mkdir(parents=True, exist_ok=True)
    names = args.models or [n for n, s in models.ZOO.items() if s.runs_in_ort]
    failed = 0
    for name in names:
        for dtype in args.dtypes:
            tag = f"{name}-{dtype}"
            t0 = time.perf_counter()
            try:
                shapes = models.ZOO[name].shapes("tiny")
                path = models.build(name, "tiny", dtype)
                result = export_ort(path, ROOT / tag, "cuda:sm_90a", shapes, "custom-ops")
                save_reference(path, shapes, ROOT / f"{tag}.npz")
                print(f"{tag:28s} exported: {result.kernel_nodes} kernel nodes, {time.perf_counter() - t0:.1f} s",
                      flush=True)
            except Exception as e:  # report every model, then fail
                failed += 1
                print(f"{tag:28s} FAILED: {type(e).__name__}: {str(e)[:1500]}", flush=True)
    return 1 if failed else 0


class FakeOrt:
    """The CUDA provider's side of the custom-op ABI, over cuda-bindings."""

    def __init__(self, cu, stream) -> None:
        self.cu, self.stream = cu, stream
        self.objects: dict[int, object] = {}
        self.strings: list[ctypes.Array] = []
        self.ops: list[int] = []
        self._next = 0x1000
        self._callbacks = []
        table = (VP * 425)()
        sig = {
            "CreateStatus": (P, ctypes.c_int, ctypes.c_char_p),
            "GetErrorMessage": (P, P),
            "ReleaseStatus": (None, P),
            "CreateCustomOpDomain": (P, ctypes.c_char_p, ctypes.POINTER(P)),
            "CustomOpDomain_Add": (P, P, P),
            "AddCustomOpDomain": (P, P, P),
            "KernelInfo_GetNodeName": (P, P, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)),
            "KernelInfoGetAttribute_string": (P, P, ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)),
            "KernelContext_GetInputCount": (P, P, ctypes.POINTER(ctypes.c_size_t)),
            "KernelContext_GetOutputCount": (P, P, ctypes.POINTER(ctypes.c_size_t)),
            "KernelContext_GetInput": (P, P, ctypes.c_size_t, ctypes.POINTER(P)),
            "KernelContext_GetOutput": (P, P, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t,
                                        ctypes.POINTER(P)),
            "GetTensorTypeAndShape": (P, P, ctypes.POINTER(P)),
            "ReleaseTensorTypeAndShapeInfo": (None, P),
            "GetTensorElementType": (P, P, ctypes.POINTER(ctypes.c_int)),
            "GetDimensionsCount": (P, P, ctypes.POINTER(ctypes.c_size_t)),
            "GetDimensions": (P, P, ctypes.POINTER(ctypes.c_int64), ctypes.c_size_t),
            "GetTensorMutableData": (P, P, ctypes.POINTER(P)),
            "KernelContext_GetGPUComputeStream": (P, P, ctypes.POINTER(P)),
        }
        for name, (res, *argtypes) in sig.items():
            fn = ctypes.CFUNCTYPE(res, *argtypes)(getattr(self, name))
            self._callbacks.append(fn)
            table[SLOTS[name]] = ctypes.cast(fn, VP)
        self.table = table
        self._get_api = ctypes.CFUNCTYPE(P, ctypes.c_uint32)(lambda v: ctypes.addressof(table) if v <= 16 else 0)
        self._version_text = ctypes.create_string_buffer(b"harness")
        self._version = ctypes.CFUNCTYPE(P)(lambda: ctypes.addressof(self._version_text))
        self.base = (VP * 2)(ctypes.cast(self._get_api, VP), ctypes.cast(self._version, VP))

    def handle(self, obj: object) -> int:
        self._next += 16
        self.objects[self._next] = obj
        return self._next

    @staticmethod
    def _copy_string(text: bytes, out, size) -> int:
        if out:
            ctypes.memmove(out, text + b"\0", min(size[0], len(text) + 1))
        size[0] = len(text) + 1
        return 0

    # -- statuses and registration ------------------------------------------------------------
    def CreateStatus(self, code, msg):
        return self.handle(("status", code, msg.decode()))

    def GetErrorMessage(self, status):
        buf = ctypes.create_string_buffer(self.objects[status][2].encode())
        self.strings.append(buf)
        return ctypes.addressof(buf)

    def ReleaseStatus(self, status):
        self.objects.pop(status, None)

    def CreateCustomOpDomain(self, domain, out):
        out[0] = self.handle(("domain", domain.decode()))
        return 0

    def CustomOpDomain_Add(self, domain, op):
        self.ops.append(op)
        return 0

    def AddCustomOpDomain(self, options, domain):
        return 0

    # -- kernel info: a dict {"name": ..., "kernel": ...} -------------------------------------
    def KernelInfo_GetNodeName(self, info, out, size):
        return self._copy_string(self.objects[info]["name"].encode(), out, size)

    def KernelInfoGetAttribute_string(self, info, name, out, size):
        value = self.objects[info].get(name.decode())
        if value is None:
            return self.CreateStatus(2, b"no such attribute")
        return self._copy_string(value.encode(), out, size)

    # -- kernel context: {"inputs": [tensor], "outputs": [tensor | None], "out_types": [...]} -
    def KernelContext_GetInputCount(self, ctx, out):
        out[0] = len(self.objects[ctx]["inputs"])
        return 0

    def KernelContext_GetOutputCount(self, ctx, out):
        out[0] = len(self.objects[ctx]["outputs"])
        return 0

    def KernelContext_GetInput(self, ctx, i, out):
        out[0] = self.objects[ctx]["inputs"][i]
        return 0

    def KernelContext_GetOutput(self, ctx, i, dims, n, out):
        c = self.objects[ctx]
        shape = tuple(dims[k] for k in range(n))
        elem = c["out_types"][i]
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(ONNX_TO_NUMPY[elem]).itemsize
        ptr = int(check(self.cu, self.cu.cuMemAlloc(max(nbytes, 256))))
        c["outputs"][i] = self.handle(("tensor", elem, shape, ptr))
        out[0] = c["outputs"][i]
        return 0

    def GetTensorTypeAndShape(self, value, out):
        out[0] = value  # the tensor stands for its own type-and-shape info
        return 0

    def ReleaseTensorTypeAndShapeInfo(self, info):
        pass

    def GetTensorElementType(self, info, out):
        out[0] = self.objects[info][1]
        return 0

    def GetDimensionsCount(self, info, out):
        out[0] = len(self.objects[info][2])
        return 0

    def GetDimensions(self, info, dims, n):
        for k, d in enumerate(self.objects[info][2][:n]):
            dims[k] = d
        return 0

    def GetTensorMutableData(self, value, out):
        out[0] = self.objects[value][3]
        return 0

    def KernelContext_GetGPUComputeStream(self, ctx, out):
        out[0] = int(self.stream)
        return 0


def check(cu, result):
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA error {err}")
    return rest[0] if len(rest) == 1 else None


def run_export(cu, stream, folder: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(folder / "model.onnx"))
    fake = FakeOrt(cu, stream)
    lib = ctypes.CDLL(str(folder / "libtilefuse_ops.so"))
    lib.RegisterCustomOps.restype = P
    status = lib.RegisterCustomOps(None, fake.base)
    assert not status, fake.objects[status]
    words = {op: ctypes.cast(op, ctypes.POINTER(VP)) for op in fake.ops}
    name_of = ctypes.CFUNCTYPE(ctypes.c_char_p, VP)
    (op,) = [op for op, w in words.items() if name_of(w[OP_GET_NAME])(op) == b"FusedKernelCuda"]
    w = words[op]
    assert name_of(w[OP_GET_PROVIDER])(op) == b"CUDAExecutionProvider"
    create = ctypes.CFUNCTYPE(P, VP, VP, P, ctypes.POINTER(VP))(w[OP_CREATE_KERNEL_V2])
    compute = ctypes.CFUNCTYPE(P, VP, P)(w[OP_COMPUTE_V2])

    def upload(a: np.ndarray, elem: int) -> int:
        a = np.ascontiguousarray(a)
        ptr = int(check(cu, cu.cuMemAlloc(max(a.nbytes, 256))))
        if a.nbytes:
            check(cu, cu.cuMemcpyHtoD(ptr, a.ctypes.data, a.nbytes))
        return fake.handle(("tensor", elem, tuple(a.shape), ptr))

    values: dict[str, int] = {}
    for t in model.graph.initializer:
        values[t.name] = upload(numpy_helper.to_array(t), t.data_type)
    for vi in model.graph.input:
        if vi.name in feeds:
            values[vi.name] = upload(feeds[vi.name], vi.type.tensor_type.elem_type)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.value_info}
    for node in model.graph.node:
        if node.op_type == "Identity":
            values[node.output[0]] = values[node.input[0]]
            continue
        assert node.op_type == "FusedKernelCuda", f"{node.op_type} needs onnxruntime"
        info = fake.handle({"name": node.name, **{a.name: a.s.decode() for a in node.attribute}})
        kernel = VP()
        status = create(op, ctypes.addressof(fake.table), info, ctypes.byref(kernel))
        if status:
            raise RuntimeError(fake.objects[status][2])
        ctx = fake.handle({"inputs": [values[x] for x in node.input], "outputs": [None] * len(node.output),
                           "out_types": [types[o] for o in node.output]})
        status = compute(kernel, ctx)
        if status:
            raise RuntimeError(fake.objects[status][2])
        for o, h in zip(node.output, fake.objects[ctx]["outputs"]):
            values[o] = h
    check(cu, cu.cuStreamSynchronize(stream))
    out = {}
    for vi in model.graph.output:
        _, elem, shape, ptr = fake.objects[values[vi.name]]
        a = np.empty(shape, ONNX_TO_NUMPY[elem])
        if a.nbytes:
            check(cu, cu.cuMemcpyDtoH(a.ctypes.data, ptr, a.nbytes))
        out[vi.name] = a
    return out


def run(args) -> int:
    from cuda.bindings import driver as cu

    from models.reference import load_reference

    from tilefuse.compare import compare_output

    check(cu, cu.cuInit(0))
    dev = check(cu, cu.cuDeviceGet(0))
    ctx = check(cu, cu.cuDevicePrimaryCtxRetain(dev))
    check(cu, cu.cuCtxSetCurrent(ctx))
    stream = check(cu, cu.cuStreamCreate(1))  # non-blocking, like onnxruntime's compute stream
    failed = total = 0
    for folder in sorted(p for p in ROOT.iterdir() if p.is_dir()):
        total += 1
        data = np.load(ROOT / f"{folder.name}.npz")
        feeds, expected = load_reference(data)
        try:
            got = run_export(cu, stream, folder, feeds)
            checks = [compare_output(n, got[n], w) for n, w in expected.items()]
            ok = all(c.ok for c in checks)
            detail = " ".join(f"{c.name}:{c.max_abs_error:.2e}" + ("" if c.ok else f" ({c.problem})") for c in checks)
        except Exception as e:
            ok, detail = False, f"{type(e).__name__}: {e} {traceback.format_exc()[-800:]}"
        failed += not ok
        print(f"{folder.name:28s} {'ok' if ok else 'FAILED':7s} {detail[:600]}", flush=True)
    print(f"{total - failed}/{total} exports match onnxruntime through the custom op's CUDA path")
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("--models", nargs="+")
    b.add_argument("--dtypes", nargs="+", default=["float32"])
    sub.add_parser("run")
    args = ap.parse_args()
    return build(args) if args.cmd == "build" else run(args)


if __name__ == "__main__":
    sys.exit(main())
