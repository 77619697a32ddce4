"""DLPack without a GPU: tilefuse's ctypes structs against themselves, against numpy's and
torch's own DLPack (a real producer and consumer), and as feeds and outputs of the CUDA
runtime with fake device pointers. On the GPU machine tools/device_feeds_check.py runs
torch CUDA tensors through the same code."""
import ctypes
import gc

import ml_dtypes
import numpy as np
import pytest

from tilefuse import dlpack
from tilefuse.errors import InputError
from tilefuse.feeds import FeedDevice, check_feeds
from tilefuse.ir.dtypes import DType
from tilefuse.ir.types import TensorType
from tilefuse.runtime import DeviceArray

CUDA, CPU = int(dlpack.DLDeviceType.CUDA), int(dlpack.DLDeviceType.CPU)


class CountingDict(dict):
    """dlpack._LIVE that counts the exporter's deleter calls (each one pops its tensor)."""

    def __init__(self):
        super().__init__()
        self.pops = []

    def pop(self, key, *default):
        self.pops.append(key)
        return super().pop(key, *default)


@pytest.fixture
def live(monkeypatch):
    table = CountingDict()
    monkeypatch.setattr(dlpack, "_LIVE", table)
    return table


class HandMade:
    """A producer's DLManagedTensor written field by field, whose deleter counts its calls."""

    def __init__(self, shape, strides=None, code=2, bits=32, lanes=1, device=(CUDA, 0), data=0x7000_0000, offset=0):
        self.calls = 0
        self.deleter = dlpack._Deleter(self._delete)  # referenced here: the callback outlives no one
        self.shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self.strides = None if strides is None else (ctypes.c_int64 * max(len(shape), 1))(*strides)
        self.managed = dlpack.DLManagedTensor()
        t = self.managed.dl_tensor
        t.data, t.device, t.ndim = data, dlpack.DLDevice(*device), len(shape)
        t.dtype = dlpack.DLDataType(code, bits, lanes)
        t.shape = ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64))
        if self.strides is not None:
            t.strides = ctypes.cast(self.strides, ctypes.POINTER(ctypes.c_int64))
        t.byte_offset = offset
        self.managed.deleter = self.deleter

    def _delete(self, address):
        assert address == ctypes.addressof(self.managed)
        self.calls += 1

    def capsule(self):
        return dlpack._new_capsule(ctypes.addressof(self.managed), dlpack.DLTENSOR, dlpack._CapsuleDestructor())


class Producer:
    """A CUDA tensor as torch or CuPy present it through DLPack, from a capsule factory."""

    def __init__(self, make_capsule, device=(CUDA, 0)):
        self._make, self._device, self.streams = make_capsule, device, []

    def __dlpack__(self, stream=None, **_):
        self.streams.append(stream)
        return self._make()

    def __dlpack_device__(self):
        return self._device


# -- the structs round trip ----------------------------------------------------------------

@pytest.mark.parametrize("dtype", list(DType))
def test_an_exported_capsule_reads_back_as_written(dtype, live):
    owner = object()
    capsule = dlpack.export_capsule(0xDEAD_0000, dtype, (2, 3, 4), (CUDA, 1), owner)
    t = dlpack.consume(capsule)
    assert (t.data, t.device, t.dtype, t.shape, t.strides) == (0xDEAD_0000, (CUDA, 1), dtype, (2, 3, 4), (12, 4, 1))
    assert len(live) == 1 and live.pops == []
    t.release()
    t.release()
    assert len(live) == 0 and len(live.pops) == 1


def test_a_scalar_and_an_empty_tensor_round_trip():
    for shape in [(), (0, 5)]:
        t = dlpack.consume(dlpack.export_capsule(0x1000, DType.FLOAT32, shape, (CUDA, 0), None))
        assert t.shape == shape and len(t.strides) == len(shape)


def test_a_consumed_capsule_is_renamed_and_cannot_be_consumed_twice():
    capsule = dlpack.export_capsule(0x1000, DType.INT32, (3,), (CUDA, 0), None)
    t = dlpack.consume(capsule)
    assert 'used_dltensor' in repr(capsule)
    with pytest.raises(ValueError):
        dlpack.consume(capsule)
    t.release()


def test_the_exporters_deleter_runs_once_whether_consumed_or_not(live):
    class Owner:
        freed = 0

        def __del__(self):
            Owner.freed += 1

    consumed = dlpack.consume(dlpack.export_capsule(0x1000, DType.FLOAT32, (4,), (CUDA, 0), Owner()))
    assert Owner.freed == 0
    del consumed  # the consumer lets go: its deleter call frees the owner
    assert Owner.freed == 1 and len(live.pops) == 1

    capsule = dlpack.export_capsule(0x1000, DType.FLOAT32, (4,), (CUDA, 0), Owner())
    del capsule  # never consumed: the capsule's destructor calls the deleter
    gc.collect()
    assert Owner.freed == 2 and len(live.pops) == 2 and len(live) == 0


def test_the_importer_calls_the_producers_deleter_exactly_once():
    made = HandMade((2, 3), data=0x2000, offset=64)
    t = dlpack.consume(made.capsule())
    assert (t.data, t.strides) == (0x2000 + 64, None)
    t.release()
    t.release()
    assert made.calls == 1

    made = HandMade((2, 3))
    t = dlpack.consume(made.capsule())
    del t  # dropped without release()
    assert made.calls == 1


@pytest.mark.parametrize("code, bits, lanes, message", [
    (5, 64, 1, "complex64"), (2, 8, 1, "float8"), (2, 32, 4, r"float32x4"), (9, 32, 1, r"\(code 9, 32 bits\)"),
])
def test_an_unsupported_dtype_is_refused_and_handed_back(code, bits, lanes, message):
    made = HandMade((2,), code=code, bits=bits, lanes=lanes)
    with pytest.raises(ValueError, match=rf"DLPack dtype {message}.* has no tilefuse dtype"):
        dlpack.consume(made.capsule())
    assert made.calls == 1


# -- a real producer and consumer: numpy, torch (CPU) -------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8, np.bool_, np.float64])
def test_numpys_capsules_parse(dtype):
    base = np.zeros((4, 6), dtype)
    a = base[1:, ::2]  # strided, with an offset
    t = dlpack.consume(a.__dlpack__())
    assert t.device == (CPU, 0)
    assert t.data == a.ctypes.data
    assert (t.dtype, t.shape) == (DType.from_numpy(dtype), (3, 3))
    assert t.strides == tuple(s // a.itemsize for s in a.strides)
    t.release()


class HostExport:
    """Host memory exported by tilefuse's exporter, for consumers without a GPU."""

    def __init__(self, array):
        self.array = array

    def __dlpack__(self, **_):
        a = self.array
        return dlpack.export_capsule(a.ctypes.data, DType.from_numpy(a.dtype), a.shape, (CPU, 0), owner=a)

    def __dlpack_device__(self):
        return (CPU, 0)


def test_numpy_reads_an_exported_capsule_in_place(live):
    source = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    got = np.from_dlpack(HostExport(source))
    assert got.ctypes.data == source.ctypes.data and got.strides == source.strides
    del source  # the capsule's owner keeps the memory
    gc.collect()
    np.testing.assert_array_equal(got, np.arange(24, dtype=np.int32).reshape(2, 3, 4))
    del got
    gc.collect()
    assert len(live) == 0 and len(live.pops) == 1


def test_torch_cpu_tensors_both_ways(live):
    torch = pytest.importorskip("torch")
    from torch.utils.dlpack import to_dlpack

    x = torch.arange(30, dtype=torch.float32).reshape(5, 6)[:, 1:4]
    t = dlpack.consume(to_dlpack(x))
    assert (t.data, t.shape, t.strides, t.dtype, t.device) == (x.data_ptr(), (5, 3), (6, 1), DType.FLOAT32, (CPU, 0))
    t.release()

    source = np.arange(12, dtype=np.float32).reshape(3, 4).astype(ml_dtypes.bfloat16)
    y = torch.from_dlpack(HostExport(source))
    assert y.dtype == torch.bfloat16 and y.data_ptr() == source.ctypes.data
    np.testing.assert_array_equal(y.float().numpy(), source.astype(np.float32))
    del y
    gc.collect()
    assert len(live) == 0


# -- as feeds -------------------------------------------------------------------------------

EXPECTED = [("x", TensorType(DType.FLOAT16, (2, 3)))]


def test_a_cuda_dlpack_tensor_is_read_in_place_on_the_sessions_stream(live):
    gpu = Producer(lambda: dlpack.export_capsule(0x7000_0000, DType.FLOAT16, (2, 3), (CUDA, 0), None))
    feeds = check_feeds(EXPECTED, {"x": gpu}, device=FeedDevice(0, 0xABC0))
    view = feeds["x"]
    assert (view.ptr, view.dtype, view.shape, view.nbytes) == (0x7000_0000, np.float16, (2, 3), 12)
    assert gpu.streams == [0xABC0]
    assert len(live) == 1  # held while the runtime may read it
    del feeds, view
    assert len(live) == 0 and len(live.pops) == 1


def test_dlpack_is_preferred_to_the_cuda_array_interface():
    gpu = Producer(lambda: dlpack.export_capsule(0x7000_0000, DType.FLOAT16, (2, 3), (CUDA, 0), None))
    gpu.__cuda_array_interface__ = {"shape": (2, 3), "typestr": "<f2", "data": (0x5000, False), "version": 3}
    assert check_feeds(EXPECTED, {"x": gpu}, device=FeedDevice())["x"].ptr == 0x7000_0000


@pytest.mark.parametrize("made, message", [
    ({"shape": (2, 3), "strides": (1, 2), "bits": 16}, r"a strided device tensor \(strides \(1, 2\) elements\)"),
    ({"shape": (2, 3), "code": 5, "bits": 64}, "DLPack dtype complex64 has no tilefuse dtype"),
    ({"shape": (2, 3), "bits": 32}, r"expected dtype float16, got float32 \(on the GPU\)"),
    ({"shape": (3, 2), "bits": 16}, r"expected shape \[2, 3\], got \[3, 2\] \(on the GPU\)"),
])
def test_wrong_dlpack_feeds_are_refused_and_handed_back(made, message):
    tensor = HandMade(**made)
    with pytest.raises(InputError, match=rf"input 'x': {message}"):
        check_feeds(EXPECTED, {"x": Producer(tensor.capsule)}, device=FeedDevice())
    assert tensor.calls == 1


@pytest.mark.parametrize("device, message", [
    ((CUDA, 1), "a tensor on cuda:1; this session runs on cuda:0"),
    ((int(dlpack.DLDeviceType.ROCM), 0), "a tensor on ROCM; this runtime reads CUDA tensors"),
])
def test_tensors_on_another_device_are_refused_unread(device, message):
    gpu = Producer(lambda: pytest.fail("consumed"), device)
    with pytest.raises(InputError, match=f"input 'x': {message}"):
        check_feeds(EXPECTED, {"x": gpu}, device=FeedDevice(0))


def test_a_cpu_plan_refuses_a_cuda_dlpack_tensor_unread():
    gpu = Producer(lambda: pytest.fail("consumed"))
    with pytest.raises(InputError, match="input 'x' is a GPU tensor; this plan runs on the CPU"):
        check_feeds(EXPECTED, {"x": gpu})


def test_cpu_dlpack_tensors_are_host_feeds():
    a = np.ones((2, 3), np.float16)
    assert check_feeds(EXPECTED, {"x": HostExport(a)}, device=FeedDevice())["x"].ctypes.data == a.ctypes.data
    assert type(check_feeds(EXPECTED, {"x": a}, device=FeedDevice())["x"]) is np.ndarray
    torch = pytest.importorskip("torch")
    got = check_feeds(EXPECTED, {"x": torch.ones(2, 3, dtype=torch.float16)}, device=FeedDevice())["x"]
    assert type(got) is np.ndarray and got.dtype == np.float16


# -- DeviceArray as a producer ---------------------------------------------------------------

class FakeExecutor:
    def __init__(self):
        self.freed = []

    def free(self, ptr):
        self.freed.append(ptr)


def test_a_device_array_exports_itself_and_lives_while_borrowed(live):
    executor = FakeExecutor()
    out = DeviceArray(0x9000_0000, np.float16, (4, 8), executor, device=1)
    assert out.__dlpack_device__() == (CUDA, 1)
    t = dlpack.consume(out.__dlpack__(stream=1, max_version=(1, 0)))
    assert (t.data, t.device, t.dtype, t.shape, t.strides) == (0x9000_0000, (CUDA, 1), DType.FLOAT16, (4, 8), (8, 1))
    del out
    assert executor.freed == []  # the consumer still reads it
    t.release()
    assert executor.freed == [0x9000_0000]

    out = DeviceArray(0x9100_0000, np.float32, (2,), executor)
    capsule = out.__dlpack__()
    del out, capsule  # exported but never consumed
    gc.collect()
    assert executor.freed == [0x9000_0000, 0x9100_0000] and len(live) == 0


def test_a_device_array_refuses_other_devices_and_copies():
    out = DeviceArray(0x9000_0000, np.float32, (2,), FakeExecutor())
    with pytest.raises(BufferError, match="cuda:0"):
        out.__dlpack__(dl_device=(CPU, 0))
    with pytest.raises(BufferError, match="copy"):
        out.__dlpack__(copy=True)
    assert out.__dlpack__(dl_device=(CUDA, 0)) is not None


def test_the_cuda_runtime_copies_a_dlpack_feed_in_and_lends_its_outputs(live):
    """CudaExecutor.run against a recording driver: the feed is copied device to device
    from the DLPack tensor's address, held until the run is over, and the output is a
    DeviceArray on the session's device that exports itself."""
    import threading
    from types import SimpleNamespace

    from tilefuse.runtime.cuda import CudaExecutor

    calls, held = [], []

    class Driver:
        CUresult = SimpleNamespace(CUDA_SUCCESS=0)

        def __getattr__(self, name):
            def call(*args):
                calls.append((name, *args))
                held.append(len(live))
                return (0, 0xB000_0000) if name == "cuMemAlloc" else (0,)
            return call

    t = TensorType(DType.FLOAT16, (2, 3))
    ex = object.__new__(CudaExecutor)
    ex.cu, ex.ctx, ex.stream, ex.device, ex._lock, ex._graph = Driver(), "ctx", 7, 1, threading.Lock(), None
    ex.plan = SimpleNamespace(steps=[], buffers=[SimpleNamespace(id=0, type=t, nbytes=12),
                                                 SimpleNamespace(id=1, type=t, nbytes=12)])
    ex._launches, ex._inputs, ex._outputs, ex.ptr = [], {"x": 0}, {"y": 1}, {0: 0xA000_0000, 1: 0xA000_1000}
    ex._checked, ex._status, ex._status_ptr = [], np.zeros((0, 2), np.int64), 0  # no kernel checks indices
    ex._spare, ex._sizes, ex._feed_event, ex._status_zero = {}, {}, "event", b""
    assert ex.feed_device == FeedDevice(1, 7)
    gpu = Producer(lambda: dlpack.export_capsule(0x7000_0000, DType.FLOAT16, (2, 3), (CUDA, 1), None), (CUDA, 1))

    (y,) = ex.run(check_feeds([("x", t)], {"x": gpu}, ex.feed_device), ["y"])
    assert gpu.streams == [7]
    assert ("cuMemcpyDtoDAsync", 0xA000_0000, 0x7000_0000, 12, 7) in calls
    assert ("cuMemcpyDtoDAsync", 0xB000_0000, 0xA000_1000, 12, 7) in calls
    assert calls[-1] == ("cuStreamSynchronize", 7) and held[-1] == 1  # the feed is held to the end
    assert len(live) == 0  # and handed back after the run
    assert isinstance(y, DeviceArray) and y.__dlpack_device__() == (CUDA, 1)
    out = dlpack.consume(y.__dlpack__())
    assert (out.data, out.shape, out.dtype) == (0xB000_0000, (2, 3), DType.FLOAT16)
    out.release()
    # a DLPack producer ordered the feed before the session's stream: the device is never waited for
    assert not [c for c in calls if c[0] in ("cuCtxSynchronize", "cuStreamWaitEvent")]
    # the output's memory, given back when the array goes, is the next run's output
    del y, out
    calls.clear()
    (y2,) = ex.run(check_feeds([("x", t)], {"x": gpu}, ex.feed_device), ["y"])
    assert y2.ptr == 0xB000_0000 and not [c for c in calls if c[0] in ("cuMemAlloc", "cuMemFree")]


@pytest.mark.parametrize("stream, waits", [(0x5555_0000, "event"), (None, "nothing"), ("absent", "device")])
def test_a_cuda_array_interface_feed_is_waited_for_on_the_stream_it_names(stream, waits):
    """A __cuda_array_interface__ feed (v3) names the stream its writes are on: the run
    records an event there and makes its own stream wait for it (no device-wide wait);
    None: nothing is pending; no stream key: the whole device is waited for, as before."""
    import threading
    from types import SimpleNamespace

    from tilefuse.runtime.cuda import CudaExecutor

    calls = []

    class Driver:
        CUresult = SimpleNamespace(CUDA_SUCCESS=0)

        def CUstream(self, handle):
            return ("stream", handle)

        def __getattr__(self, name):
            def call(*args):
                calls.append((name, *args))
                return (0, 0xB000_0000) if name == "cuMemAlloc" else (0,)
            return call

    class Tensor:
        def __init__(self):
            self.__cuda_array_interface__ = {"shape": (2, 3), "typestr": "<f2", "data": (0x7000_0000, False), "version": 3}
            if stream != "absent":
                self.__cuda_array_interface__["stream"] = stream

    t = TensorType(DType.FLOAT16, (2, 3))
    ex = object.__new__(CudaExecutor)
    ex.cu, ex.ctx, ex.stream, ex.device, ex._lock, ex._graph = Driver(), "ctx", 7, 0, threading.Lock(), None
    ex.plan = SimpleNamespace(steps=[], buffers=[SimpleNamespace(id=0, type=t, nbytes=12), SimpleNamespace(id=1, type=t, nbytes=12)])
    ex._launches, ex._inputs, ex._outputs, ex.ptr = [], {"x": 0}, {"y": 1}, {0: 0xA000_0000, 1: 0xA000_1000}
    ex._checked, ex._status, ex._status_ptr = [], np.zeros((0, 2), np.int64), 0
    ex._spare, ex._sizes, ex._feed_event, ex._status_zero = {}, {}, "event", b""
    ex.run(check_feeds([("x", t)], {"x": Tensor()}, ex.feed_device), ["y"])
    names = [c[0] for c in calls]
    copy_in = names.index("cuMemcpyDtoDAsync")
    if waits == "event":
        assert ("cuEventRecord", "event", ("stream", 0x5555_0000)) in calls
        assert names.index("cuStreamWaitEvent") < copy_in and calls[names.index("cuStreamWaitEvent")][1:3] == (7, "event")
    else:
        assert "cuEventRecord" not in names and "cuStreamWaitEvent" not in names
    assert ("cuCtxSynchronize" in names) == (waits == "device")
