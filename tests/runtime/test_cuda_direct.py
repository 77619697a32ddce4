"""run() with GPU feeds on a plan of kernels: one graph whose kernels read the feeds where
they are and write each output into its array (runtime/cuda_direct.py), re-pointed only
when an address changes; against the stand-in driver of tests/runtime/cuda_standin.py
(the GPU machine runs real kernels: benchmarks/gpu_run_overhead.py checks that its
outputs equal a host run's)."""
import ctypes
import gc

import numpy as np
import pytest

from tests.runtime.cuda_standin import COLS, N, ROWS, Driver, caller_memory, gather_plan, view
from tilefuse.errors import ExecutionError
from tilefuse.feeds import DeviceView
from tilefuse.runtime import cuda as cuda_runtime
from tilefuse.runtime.session import InferenceSession

TABLE = np.arange(ROWS * COLS, dtype=np.float32).reshape(ROWS, COLS)


@pytest.fixture
def session(tmp_path, monkeypatch):
    driver = Driver()
    monkeypatch.setattr(cuda_runtime, "_driver", lambda: driver)
    sess = InferenceSession(gather_plan(tmp_path))
    yield sess, driver
    sess.close()


def _ids(values, aligned=True):
    """Caller's "device" memory holding ``values``, and a feed over it."""
    keep, ids = caller_memory(ctypes.c_int64, N, aligned)
    ids[:] = list(values)
    return keep, DeviceView(ctypes.addressof(ids), np.dtype(np.int64), (N,), ready="ready")


def _host(out):
    return view(out.ptr, out.dtype, out.shape).copy()


def test_kernels_read_the_feed_and_write_the_outputs_in_place(session):
    sess, driver = session
    ex = sess._executor
    rng = np.random.default_rng()
    ids = rng.integers(-ROWS, ROWS, N)
    keep, feed = _ids(ids)
    y, y2 = ex.run({"ids": feed}, ["y", "y2"])
    np.testing.assert_array_equal(_host(y), TABLE[ids])
    np.testing.assert_array_equal(_host(y2), TABLE[ids])
    graph = driver.graphs[-1]  # the direct graph: both kernels, then the status words' copy
    assert [op[0] for op in graph] == ["launch", "launch", "copy"]
    assert graph[0][2][:3] == (feed.ptr, ex.ptr[1], y.ptr) and graph[1][2][:3] == (feed.ptr, ex.ptr[1], y2.ptr)
    assert sorted(driver.repointed) == [0, 1]  # the first run points both at the feed and outputs
    copies = [op for op in driver.graphs[0] if op[0] == "copy"]
    assert not copies  # the plan's own graph (host runs) copies nothing either


def test_the_same_addresses_run_after_run_re_point_nothing(session):
    """A server feeding the same tensor and dropping each run's outputs: the pool hands
    the outputs' memory back, so the graph launches as it is."""
    sess, driver = session
    ex = sess._executor
    keep, feed = _ids([1, 2, 3, 4])
    ptrs = [o.ptr for o in ex.run({"ids": feed}, ["y", "y2"])]
    gc.collect()
    driver.repointed.clear()
    for _ in range(3):
        ids = np.random.default_rng().integers(0, ROWS, N)
        view(feed.ptr, np.int64, (N,))[:] = ids
        outs = ex.run({"ids": feed}, ["y", "y2"])
        assert [o.ptr for o in outs] == ptrs
        np.testing.assert_array_equal(_host(outs[0]), TABLE[ids])
        del outs
    assert driver.repointed == []


def test_held_outputs_get_new_memory_and_keep_their_values(session):
    sess, driver = session
    ex = sess._executor
    keep1, first = _ids([1, 2, 3, 4])
    keep2, second = _ids([5, 6, 7, 8])
    a = ex.run({"ids": first}, ["y", "y2"])
    driver.repointed.clear()
    b = ex.run({"ids": second}, ["y", "y2"])
    assert {o.ptr for o in a}.isdisjoint(o.ptr for o in b)
    assert sorted(driver.repointed) == [0, 1]
    np.testing.assert_array_equal(_host(a[0]), TABLE[[1, 2, 3, 4]])  # not overwritten
    np.testing.assert_array_equal(_host(b[1]), TABLE[[5, 6, 7, 8]])


def test_an_unaligned_feed_is_copied_into_the_plan_and_read_there(session):
    sess, driver = session
    ex = sess._executor
    keep, feed = _ids([9, 0, -1, 4], aligned=False)
    (y,) = ex.run({"ids": feed}, ["y"])
    np.testing.assert_array_equal(_host(y), TABLE[[9, 0, -1, 4]])
    assert driver.graphs[-1][0][2][0] == ex.ptr[0]  # the kernels read the plan's input buffer
    keep2, aligned = _ids([3, 3, 3, 3])
    (y,) = ex.run({"ids": aligned}, ["y"])  # and where the feed is, once it may
    assert driver.graphs[-1][0][2][0] == aligned.ptr
    np.testing.assert_array_equal(_host(y), TABLE[[3, 3, 3, 3]])


def test_outputs_asked_once_twice_or_not_at_all(session):
    """An output not asked for is written where the plan keeps it; one asked twice is
    written once and copied to the second array."""
    sess, driver = session
    ex = sess._executor
    keep, feed = _ids([0, 1, 2, 3])
    y, again = ex.run({"ids": feed}, ["y", "y"])
    assert y.ptr != again.ptr
    np.testing.assert_array_equal(_host(again), _host(y))
    assert driver.graphs[-1][1][2][2] == ex.ptr[3]  # y2, not asked for: its arena buffer
    np.testing.assert_array_equal(view(ex.ptr[3], np.float32, (N, COLS)), TABLE[[0, 1, 2, 3]])


def test_a_bad_index_fails_the_run_and_the_next_one_succeeds(session):
    sess, driver = session
    ex = sess._executor
    keep, feed = _ids([1, 2**40, 2, 3])
    with pytest.raises(ExecutionError, match=f"index {2**40} is outside"):
        ex.run({"ids": feed}, ["y"])
    view(feed.ptr, np.int64, (N,))[1] = -2
    (y,) = ex.run({"ids": feed}, ["y"])
    np.testing.assert_array_equal(_host(y), TABLE[[1, -2, 2, 3]])


def test_host_runs_are_unchanged_beside_direct_ones(session):
    sess, driver = session
    ex = sess._executor
    keep, feed = _ids([4, 5, 6, 7])
    ex.run({"ids": feed}, ["y"])
    y, y2 = sess.run(None, {"ids": np.array([7, 6, 5, 4], np.int64)})
    np.testing.assert_array_equal(y, TABLE[[7, 6, 5, 4]])
    np.testing.assert_array_equal(y2, TABLE[[7, 6, 5, 4]])


def test_a_driver_that_names_no_captured_node_leaves_run_copying(session, monkeypatch):
    sess, driver = session
    ex = sess._executor
    monkeypatch.delattr(Driver, "cuStreamGetCaptureInfo")
    keep, feed = _ids([2, 4, 6, 8])
    y, y2 = ex.run({"ids": feed}, ["y", "y2"])
    assert "does not name captured nodes" in ex.direct_reason and ex._direct is None
    np.testing.assert_array_equal(_host(y2), TABLE[[2, 4, 6, 8]])
    assert not driver.repointed


def _on_stream(values, stream=0x5555_0000):
    """A feed whose pending writes are on the caller's ``stream`` (as a torch tensor's are
    on torch's current stream)."""
    keep, feed = _ids(values)
    return keep, DeviceView(feed.ptr, feed.dtype, feed.shape, ready="stream", stream=stream)


def test_a_run_not_waited_for_orders_its_outputs_on_the_feeds_stream(session):
    """wait=False: the run is queued, the caller's stream waits for its end, and the host
    does not wait at all; the outputs are the run's."""
    sess, driver = session
    keep, feed = _on_stream([1, 2, 3, 4])
    driver.calls.clear()
    y, y2 = sess._executor.run({"ids": feed}, ["y", "y2"], wait=False)
    assert not [c for c in driver.calls if c[0] == "sync"]
    done = sess._executor._done_event
    assert driver.calls[-2:] == [("record", done, 7), ("wait", 0x5555_0000, done)]  # after the run, on its stream
    assert ("wait", 7, sess._executor._feed_event) in driver.calls  # and the run after the feed's writes
    np.testing.assert_array_equal(_host(y), TABLE[[1, 2, 3, 4]])
    driver.calls.clear()
    (y,) = sess._executor.run({"ids": feed}, ["y"])  # waited for, as by default
    assert driver.calls[-1] == ("sync", 7)


class _Tensor:
    """A caller's GPU tensor as ``__cuda_array_interface__`` v3 gives it, with its stream."""

    def __init__(self, view: DeviceView) -> None:
        self.__cuda_array_interface__ = {"shape": view.shape, "typestr": view.dtype.str, "data": (view.ptr, False),
                                         "version": 3, "stream": view.stream}


def test_a_bad_index_in_a_run_not_waited_for_fails_the_next_run_or_synchronize(session):
    sess, driver = session
    keep, bad = _on_stream([1, 99, 2, 3])
    keep2, good = _on_stream([0, 1, 2, 3])
    bad, good = _Tensor(bad), _Tensor(good)
    sess.run(None, {"ids": bad}, wait=False)  # queued: nothing raised yet
    with pytest.raises(ExecutionError, match="a run not waited for .*index 99 is outside"):
        sess.run(None, {"ids": good}, wait=False)
    (y, _) = sess.run(None, {"ids": good}, wait=False)  # the words were cleared: the next is fine
    np.testing.assert_array_equal(_host(y), TABLE[[0, 1, 2, 3]])
    sess.run(None, {"ids": bad}, wait=False)
    with pytest.raises(ExecutionError, match="index 99 is outside"):
        sess.synchronize()
    sess.synchronize()  # nothing left to report
    sess.run(None, {"ids": bad}, wait=False)
    driver.busy = True  # that run not yet done: the next is queued behind it, nothing raised
    sess.run(None, {"ids": good}, wait=False)
    driver.busy = False
    with pytest.raises(ExecutionError, match="a run not waited for .*index 99 is outside"):
        sess.run(None, {"ids": good})  # a run waited for reports it


@pytest.mark.parametrize("ready", ["ready", "ordered"])
def test_feeds_that_name_no_stream_are_waited_for_anyway(session, ready):
    """Without a stream to order the outputs on (and for host feeds), a run waits."""
    sess, driver = session
    keep, feed = _ids([1, 2, 3, 4])
    driver.calls.clear()
    sess._executor.run({"ids": DeviceView(feed.ptr, feed.dtype, feed.shape, ready=ready)}, ["y"], wait=False)
    assert driver.calls[-1] == ("sync", 7)
    driver.calls.clear()
    sess.run(None, {"ids": np.array([1, 2, 3, 4], np.int64)}, wait=False)
    assert driver.calls[-1] == ("sync", 7)


def test_a_bound_run_not_waited_for_orders_its_outputs_and_reports_a_bad_index_later(session):
    """binding.run(wait=False): queued, the stream passed waits for its end, no host wait;
    a bad index in the bound input is raised by the next run that looks, or synchronize."""
    sess, driver = session
    keep, ids = caller_memory(ctypes.c_int64, N, True)
    ids[:] = [2, 0, 1, 3]
    bound = sess._executor.bind({"ids": DeviceView(ctypes.addressof(ids), np.dtype(np.int64), (N,), ready="ready")},
                                {"y": None, "y2": None})
    driver.calls.clear()
    bound.run(stream=0x5555_0000, wait=False)
    assert not [c for c in driver.calls if c[0] == "sync"]
    done = sess._executor._done_event
    assert driver.calls[-2:] == [("record", done, 7), ("wait", 0x5555_0000, done)]
    np.testing.assert_array_equal(_host(bound.outputs[0]), TABLE[[2, 0, 1, 3]])
    ids[1] = ROWS + 5
    bound.run(wait=False)  # queued: nothing raised yet
    with pytest.raises(ExecutionError, match=f"a run not waited for .*index {ROWS + 5} is outside"):
        bound.run(wait=False)
    ids[1] = 1
    bound.run(wait=False)
    sess.synchronize()  # the words were cleared: nothing to report
    np.testing.assert_array_equal(_host(bound.outputs[1]), TABLE[[2, 1, 1, 3]])
    driver.calls.clear()
    bound.run()  # waited for, as by default
    assert driver.calls[-1] == ("sync", 7)


def test_no_driver_library_is_a_clean_error(tmp_path, monkeypatch):
    """cuda-bindings without an NVIDIA driver (a newer one raises from cuInit): an
    ExecutionError saying so, not the loader's exception."""
    from tilefuse.errors import ExecutionError

    class NoLibrary(Driver):
        def cuInit(self, flags):
            raise RuntimeError('"cuda" is an NVIDIA driver library and can only be found via system search')

    monkeypatch.setattr(cuda_runtime, "_driver", lambda: NoLibrary())
    with pytest.raises(ExecutionError, match="no NVIDIA driver to run this CUDA plan on"):
        InferenceSession(gather_plan(tmp_path))
