"""torch CUDA tensors as feeds read through their own attributes (tilefuse/torch_feeds.py):
the address, dtype and shape the tensor says, held while the view lives, waited for on
torch's current stream by an event of the runtime's own; contiguity, the device and dtypes
numpy cannot name handled as DLPack handles them. Here against a stand-in with torch's
attribute surface; against real torch CUDA tensors where the machine has them (the GPU
machine: `python -m pytest tests/runtime/test_torch_feeds.py`)."""
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from tilefuse.errors import InputError
from tilefuse.feeds import DeviceView, FeedChecker, FeedDevice, check_feeds
from tilefuse.ir import DType, TensorType

EXPECTED = [("x", TensorType(DType.FLOAT16, (2, 3)))]


class StandIn:
    """What InferenceSession reads of a torch CUDA tensor (no memory behind it)."""

    def __init__(self, dtype="torch.float16", shape=(2, 3), device=0, contiguous=True):
        self.dtype, self.shape, self.is_cuda = dtype, shape, True
        self._device, self._contiguous = device, contiguous

    def data_ptr(self):
        return 0x7000_0000

    def get_device(self):
        return self._device

    def is_contiguous(self):
        return self._contiguous

    def stride(self):
        return (1, 2)

    def is_conj(self):
        return False

    def is_neg(self):
        return False


StandIn.__module__ = "torch"  # as torch.Tensor's own class reports it


@pytest.fixture
def current_stream(monkeypatch):
    """torch's current stream, as the stand-in module reports it (settable per test)."""
    state = {"handle": 0x5555_0000}
    fake = SimpleNamespace(cuda=SimpleNamespace(current_stream=lambda device: SimpleNamespace(cuda_stream=state["handle"])))
    monkeypatch.setitem(sys.modules, "torch", fake)
    return state


def test_a_torch_tensor_is_read_in_place_and_waited_for_on_torchs_stream(current_stream):
    t = StandIn()
    view = check_feeds(EXPECTED, {"x": t}, device=FeedDevice(0, 7))["x"]
    assert isinstance(view, DeviceView) and view.keep is t  # no DLPack capsule: the tensor itself is held
    assert (view.ptr, view.dtype, view.shape) == (0x7000_0000, np.dtype(np.float16), (2, 3))
    assert (view.ready, view.stream) == ("stream", 0x5555_0000)
    current_stream["handle"] = 0  # torch's legacy default stream is the driver's CU_STREAM_LEGACY
    assert check_feeds(EXPECTED, {"x": t}, device=FeedDevice(0, 7))["x"].stream == 1
    current_stream["handle"] = 7  # written on the session's own stream: already in order
    assert check_feeds(EXPECTED, {"x": t}, device=FeedDevice(0, 7))["x"].ready == "ordered"


@pytest.mark.parametrize("tensor, message", [
    (StandIn(contiguous=False), "strided device tensor"),
    (StandIn(device=1), "on cuda:1; this session runs on cuda:0"),
    (StandIn(dtype="torch.float32"), "expected dtype float16, got float32"),
    (StandIn(shape=(3, 2)), r"expected shape \[2, 3\], got \[3, 2\]"),
], ids=["strided", "other-device", "dtype", "shape"])
def test_a_torch_tensor_the_runtime_cannot_read_is_refused(current_stream, tensor, message):
    with pytest.raises(InputError, match=message):
        check_feeds(EXPECTED, {"x": tensor}, device=FeedDevice(0, 7))


def test_a_cpu_plan_refuses_a_torch_cuda_tensor(current_stream):
    with pytest.raises(InputError, match="GPU tensor; this plan runs on the CPU"):
        check_feeds(EXPECTED, {"x": StandIn()})


def test_the_feed_checker_reads_torch_tensors_as_check_feeds_does_asking_the_stream_once(current_stream, monkeypatch):
    expected = EXPECTED + [("y", TensorType(DType.FLOAT16, (4,)))]
    feeds = {"x": StandIn(), "y": StandIn(shape=(4,))}
    checker = FeedChecker(expected, FeedDevice(0, 7))
    asked = []
    torch = sys.modules["torch"]
    ask = torch.cuda.current_stream
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: asked.append(device) or ask(device))
    fast = checker(feeds)
    assert asked == [0]  # one run's feeds share torch's current stream: asked once
    slow = check_feeds(expected, feeds, device=FeedDevice(0, 7))
    for name in ("x", "y"):
        a, b = fast[name], slow[name]
        assert (a.ptr, a.dtype, a.shape, a.keep, a.ready, a.stream) == (b.ptr, b.dtype, b.shape, b.keep, b.ready, b.stream)
    # Anything the fast path does not take gets check_feeds' own message.
    with pytest.raises(InputError, match=r"input 'y'.*expected shape \[4\], got \[5\]"):
        checker({"x": StandIn(), "y": StandIn(shape=(5,))})
    with pytest.raises(InputError, match="on cuda:1; this session runs on cuda:0"):
        checker({"x": StandIn(), "y": StandIn(shape=(4,), device=1)})


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


@pytest.mark.skipif(_torch_cuda() is None, reason="needs torch with a CUDA device (the GPU machine)")
def test_real_torch_cuda_tensors_take_the_direct_path_and_bfloat16_dlpack():
    torch = _torch_cuda()
    x = torch.randn(2, 3, device="cuda").half()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        view = check_feeds(EXPECTED, {"x": x}, device=FeedDevice(0, None))["x"]
    assert view.keep is x and view.ptr == x.data_ptr() and (view.ready, view.stream) == ("stream", side.cuda_stream)
    with pytest.raises(InputError, match="strided device tensor"):
        check_feeds([("x", TensorType(DType.FLOAT16, (3, 2)))], {"x": x.t()}, device=FeedDevice(0, None))
    b = torch.ones(2, 3, device="cuda", dtype=torch.bfloat16)  # no numpy name: DLPack reads it
    view = check_feeds([("x", TensorType(DType.BFLOAT16, (2, 3)))], {"x": b}, device=FeedDevice(0, None))["x"]
    assert view.keep is not b and view.ptr == b.data_ptr()
