"""GPU tensors as feeds (``__cuda_array_interface__``; DLPack ones in test_dlpack.py):
checked like host arrays, refused by CPU plans with a clear error. Running them on a GPU
is in test_cuda_runtime.py and benchmarks/gpu_check.py (device feeds through torch there)."""
import numpy as np
import pytest

from tilefuse.errors import InputError
from tilefuse.ir.dtypes import DType
from tilefuse.ir.types import TensorType
from tilefuse.feeds import DeviceView, FeedDevice, check_feeds, device_view


class FakeGpuTensor:
    """What torch and CuPy expose for a CUDA tensor (no memory behind it here)."""

    def __init__(self, shape, typestr="<f4", strides=None, ptr=0x7000_0000):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False),
                                         "strides": strides, "version": 3}


EXPECTED = [("x", TensorType(DType.FLOAT32, (2, 3)))]


def test_a_gpu_tensor_of_the_right_type_becomes_a_device_view():
    out = check_feeds(EXPECTED, {"x": FakeGpuTensor((2, 3))}, device=FeedDevice())
    assert out["x"] == DeviceView(0x7000_0000, np.dtype("float32"), (2, 3), ready="unknown")
    assert out["x"].nbytes == 24


@pytest.mark.parametrize("entry, ready, stream", [
    ({}, "unknown", 0),  # no stream key: nothing says where it was written (the whole device is waited for)
    ({"stream": None}, "ready", 0),  # v3: nothing pending
    ({"stream": 1}, "stream", 1),  # the legacy default stream
    ({"stream": 2}, "stream", 2),  # the per-thread default stream
    ({"stream": 0x5555_0000}, "stream", 0x5555_0000),  # torch's current stream handle
])
def test_the_stream_a_gpu_tensor_names_is_what_the_run_waits_for(entry, ready, stream):
    t = FakeGpuTensor((2, 3))
    t.__cuda_array_interface__.update(entry)
    view = device_view(t)
    assert (view.ready, view.stream) == (ready, stream)


@pytest.mark.parametrize("bad", [0, -0.5, "s", True])
def test_a_stream_the_interface_does_not_allow_is_refused(bad):
    t = FakeGpuTensor((2, 3))
    t.__cuda_array_interface__["stream"] = bad
    with pytest.raises(InputError, match="names stream"):
        check_feeds(EXPECTED, {"x": t}, device=FeedDevice())


@pytest.mark.parametrize("tensor, message", [
    (FakeGpuTensor((3, 2)), r"expected shape \[2, 3\], got \[3, 2\] \(on the GPU\)"),
    (FakeGpuTensor((2, 3), "<f2"), r"expected dtype float32, got float16 \(on the GPU\)"),
    (FakeGpuTensor((2, 3), strides=(4, 8)), r"strided device tensor"),
])
def test_wrong_gpu_feeds_name_the_input_and_the_problem(tensor, message):
    with pytest.raises(InputError, match=rf"input 'x': .*{message}"):
        check_feeds(EXPECTED, {"x": tensor}, device=FeedDevice())


def test_contiguous_strides_are_accepted():
    assert device_view(FakeGpuTensor((2, 3), strides=(12, 4))).shape == (2, 3)
    assert device_view(np.zeros(3)) is None


def test_a_cpu_plan_refuses_gpu_tensors(tmp_path, zoo_cache):
    import models
    from tilefuse.compiler import compile
    from tilefuse.runtime import InferenceSession

    shapes = models.ZOO["mlp"].shapes("tiny")
    path = models.build("mlp", "tiny", "float32", cache_dir=zoo_cache)
    sess = InferenceSession(compile(path, "cpu", shapes))
    (inp,) = sess.get_inputs()
    with pytest.raises(InputError, match=f"input '{inp.name}' is a GPU tensor; this plan runs on the CPU"):
        sess.run(None, {inp.name: FakeGpuTensor(tuple(inp.shape))})
