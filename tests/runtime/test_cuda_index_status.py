"""The CUDA runtime's status words (kernels that check indices), against a stand-in
driver: "device" memory is host memory, copies are memmove, the CUDA graph replays the
launches it captured, and each "kernel" is a Python gather that behaves as tilefuse's do
(tf_index in codegen/cuda/include/tilefuse_index.cuh: a bad index reads row 0 and claims
the status word; tests/runtime/cuda_standin.py). The GPU machine runs real kernels:
tools/gpu_index_check.py."""
import ctypes

import numpy as np
import pytest

from tests.runtime.cuda_standin import COLS, N, ROWS, SITES, Driver, caller_memory, gather_plan
from tests.runtime.cuda_standin import view as _view
from tilefuse.errors import ExecutionError
from tilefuse.runtime import cuda as cuda_runtime
from tilefuse.runtime.session import InferenceSession


@pytest.fixture
def session(tmp_path, monkeypatch):
    driver = Driver()
    monkeypatch.setattr(cuda_runtime, "_driver", lambda: driver)
    return InferenceSession(gather_plan(tmp_path)), driver


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
    keep_ids, ids_dev = caller_memory(ctypes.c_int64, N, aligned)  # "device" memory of the caller's
    keep_y, y_dev = caller_memory(ctypes.c_float, N * COLS, aligned)
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
