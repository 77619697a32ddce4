"""A waited run() on the same torch tensors as the run before launches the direct graph
and waits, with no feed reading (runtime/cuda_steady.py); anything that differs takes the
full path. Against the stand-in driver of tests/runtime/cuda_standin.py and a stand-in
for torch's tensor surface; the GPU machine times the real thing
(benchmarks/gpu_run_overhead.py)."""
import ctypes
import gc
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from tests.runtime.cuda_standin import COLS, N, ROWS, Driver, caller_memory, gather_plan, view
from tilefuse.errors import ExecutionError, InputError
from tilefuse.runtime import cuda as cuda_runtime
from tilefuse.runtime.session import InferenceSession

TABLE = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)
INT64 = "torch.int64"  # the stand-in's dtype object (torch's are singletons too)


class Tensor:
    """A torch CUDA tensor as run() reads one, over the caller's "device" memory."""

    def __init__(self, memory, shape=(N,), dtype=INT64, contiguous=True, device=0) -> None:
        self.memory, self.shape, self.dtype, self.is_cuda = memory, shape, dtype, True
        self._contiguous, self._device = contiguous, device

    def data_ptr(self):
        return ctypes.addressof(self.memory)

    def get_device(self):
        return self._device

    def is_contiguous(self):
        return self._contiguous

    def stride(self):
        return (2,)

    def is_neg(self):
        return False

    def is_conj(self):
        return False


Tensor.__module__ = "torch"


@pytest.fixture
def torch_stream(monkeypatch):
    """torch's current stream (the raw handle torch's generated code asks for), settable."""
    state = {"raw": 0x5555_0000}
    raw = lambda device: state["raw"]  # noqa: E731
    fake = SimpleNamespace(_C=SimpleNamespace(_cuda_getCurrentRawStream=raw),
                           cuda=SimpleNamespace(current_stream=lambda d: SimpleNamespace(cuda_stream=raw(d))))
    monkeypatch.setitem(sys.modules, "torch", fake)
    return state


@pytest.fixture
def session(tmp_path, monkeypatch, torch_stream):
    driver = Driver()
    monkeypatch.setattr(cuda_runtime, "_driver", lambda: driver)
    sess = InferenceSession(gather_plan(tmp_path))
    checked = []
    check = sess._check
    sess._check = lambda feeds: checked.append(1) or check(feeds)  # the full path's feed reading
    yield sess, driver, checked
    sess.close()


def _tensor(values, **kw):
    keep, ids = caller_memory(ctypes.c_int64, N, True)
    ids[:] = list(values)
    return keep, Tensor(ids, **kw)


def _host(out):
    return view(out.ptr, out.dtype, out.shape).copy()


def test_the_same_tensors_again_launch_and_wait_with_no_feed_reading(session):
    sess, driver, checked = session
    keep, t = _tensor([1, 2, 3, 4])
    first = [o.ptr for o in sess.run(None, {"ids": t})]
    gc.collect()
    assert checked == [1]
    rng = np.random.default_rng()
    for _ in range(3):
        ids = rng.integers(-ROWS, ROWS, N)  # new values in the same memory, negative ones too
        view(t.data_ptr(), np.int64, (N,))[:] = ids
        driver.calls.clear()
        launched = len(driver.launched)
        y, y2 = sess.run(None, {"ids": t})
        assert checked == [1]  # no feed reading: the steady path ran
        assert [y.ptr, y2.ptr] == first and len(driver.launched) == launched + 2
        assert driver.calls == [("record", "event1", 0x5555_0000), ("wait", 7, "event1"), ("sync", 7)]
        np.testing.assert_array_equal(_host(y), TABLE[ids])
        np.testing.assert_array_equal(_host(y2), TABLE[ids])
        del y, y2


def test_on_torchs_legacy_stream_nothing_is_ordered_but_the_wait(session, torch_stream):
    sess, driver, checked = session
    torch_stream["raw"] = 0  # torch's default: the plan's blocking stream waits for it anyway
    keep, t = _tensor([1, 2, 3, 4])
    sess.run(None, {"ids": t})
    driver.calls.clear()
    sess.run(["y"], {"ids": t})  # other outputs asked: the full path, then steady again
    (y,) = sess.run(["y"], {"ids": t})
    assert checked == [1, 1] and driver.calls == [("sync", 7), ("sync", 7)]
    np.testing.assert_array_equal(_host(y), TABLE[[1, 2, 3, 4]])


@pytest.mark.parametrize("change", ["address", "stream", "held outputs", "names", "run not waited for"])
def test_anything_that_differs_takes_the_full_path_and_is_right(session, torch_stream, change):
    sess, driver, checked = session
    keep, t = _tensor([1, 2, 3, 4])
    held = sess.run(None, {"ids": t})
    if change != "held outputs":
        del held
    keep2, t2 = _tensor([4, 3, 2, 1])
    feeds, want, names = {"ids": t}, TABLE[[1, 2, 3, 4]], None
    if change == "address":
        feeds, want = {"ids": t2}, TABLE[[4, 3, 2, 1]]
    elif change == "stream":
        torch_stream["raw"] = 0x6666_0000
    elif change == "names":
        names = ["y2", "y"]
    elif change == "run not waited for":
        sess.run(None, {"ids": t2}, wait=False)
        driver.busy = True  # not yet done: the steady path must not run over it
    driver.calls.clear()
    outs = sess.run(names, feeds)
    driver.busy = False
    assert checked == [1, 1, 1] if change == "run not waited for" else checked == [1, 1]
    np.testing.assert_array_equal(_host(outs[0]), want)
    if change == "stream":  # the run came after the new stream's work
        assert ("record", "event1", 0x6666_0000) in driver.calls
    if change == "held outputs":  # new memory for the outputs, the held ones keep their values
        assert {o.ptr for o in outs}.isdisjoint(o.ptr for o in held)
        np.testing.assert_array_equal(_host(held[0]), TABLE[[1, 2, 3, 4]])


@pytest.mark.parametrize("tensor, message", [
    (dict(shape=(N + 1,)), r"expected shape \[4\], got \[5\]"),
    (dict(contiguous=False), "strided device tensor"),
    (dict(device=1), "on cuda:1; this session runs on cuda:0"),
], ids=["shape", "strided", "device"])
def test_a_tensor_changed_in_place_is_read_again_and_refused(session, tensor, message):
    """The same object and address as the steady run's, but no longer the tensor it read."""
    sess, driver, checked = session
    keep, t = _tensor([1, 2, 3, 4])
    sess.run(None, {"ids": t})
    sess.run(None, {"ids": t})
    for k, v in tensor.items():
        setattr(t, {"shape": "shape", "contiguous": "_contiguous", "device": "_device"}[k], v)
    with pytest.raises(InputError, match=message):
        sess.run(None, {"ids": t})


def test_a_bad_index_fails_the_steady_run_and_the_next_one_succeeds(session):
    sess, driver, checked = session
    keep, t = _tensor([1, 2, 3, 4])
    sess.run(None, {"ids": t})
    view(t.data_ptr(), np.int64, (N,))[:] = [0, ROWS + 7, 1, 2]
    with pytest.raises(ExecutionError, match=f"index {ROWS + 7} is outside"):
        sess.run(None, {"ids": t})
    assert checked == [1]
    view(t.data_ptr(), np.int64, (N,))[:] = [3, 2, 1, 0]
    y, _ = sess.run(None, {"ids": t})
    np.testing.assert_array_equal(_host(y), TABLE[[3, 2, 1, 0]])


def test_a_closed_session_refuses_the_steady_run(session):
    sess, driver, checked = session
    keep, t = _tensor([1, 2, 3, 4])
    sess.run(None, {"ids": t})
    sess.close()
    with pytest.raises(ExecutionError, match="closed"):
        sess.run(None, {"ids": t})


def test_feeds_not_in_a_dict_go_the_full_way(session):
    """A list of the right length is refused as the full path refuses it; another mapping
    type is read there."""
    from types import MappingProxyType

    sess, driver, checked = session
    keep, t = _tensor([1, 2, 3, 4])
    sess.run(None, {"ids": t})
    with pytest.raises(InputError, match="feeds must be"):
        sess.run(None, [t])
    y, _ = sess.run(None, MappingProxyType({"ids": t}))
    np.testing.assert_array_equal(_host(y), TABLE[[1, 2, 3, 4]])
