"""Sessions release what they load (issue 15, item 7): kernel libraries on the CPU; CUDA
modules, device memory, the graph, the stream, events and the context on the GPU,
checked against a recording driver. ``close()``, a ``with`` block and the finaliser of
a dropped session each release everything; a run after that is a clear error.

Mapping counts are read from /proc/self/maps in a fresh interpreter (a crash there, from
a library unloaded under a running kernel, fails the test instead of pytest).
"""
from __future__ import annotations

import ctypes
import gc
import hashlib
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tilefuse.plan.files import write_manifest
from tilefuse.errors import ExecutionError, PlanError
from tilefuse.runtime import DeviceArray, InferenceSession

from tests.plan.handmade import cuda_mlp_plan, mlp_graph, random_feeds

REPO = Path(__file__).resolve().parents[2]


def _python(code: str, *args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """A plan of generated kernels (OpenMP parallel regions: the products are big enough),
    and its graph."""
    from tilefuse.compiler import compile_graph
    from tilefuse.target import CPU

    graph = mlp_graph(64, 128, 256)
    plan = compile_graph(graph, CPU).plan
    return graph, plan.save(tmp_path_factory.mktemp("generated") / "mlp.tfplan")


def _distinct_copies(path: Path, folder: Path, n: int) -> list[Path]:
    """``n`` copies of a plan whose kernel files differ (bytes appended past the ELF
    image, the manifest's hashes updated): ``n`` different libraries to load."""
    out = []
    for i in range(n):
        copy = folder / f"p{i}.tfplan"
        (copy / "kernels").mkdir(parents=True)
        m = json.loads((path / "manifest.json").read_text())
        for k in m["kernels"]:
            data = (path / k["file"]).read_bytes() + f"copy {i}".encode()
            (copy / k["file"]).write_bytes(data)
            k["sha256"] = hashlib.sha256(data).hexdigest()
        (copy / "weights.safetensors").write_bytes((path / "weights.safetensors").read_bytes())
        write_manifest(copy, m)
        out.append(copy)
    return out


MAPS = r"""
import gc, sys
import numpy as np
from tilefuse.runtime import InferenceSession

paths = sys.argv[1:]
feeds = {"x": np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)}
maps = lambda: sum(1 for _ in open("/proc/self/maps"))
with InferenceSession(paths[0]) as s:  # imports, private directories, OpenMP's threads
    want = s.run(None, feeds)
before = maps()
for i, path in enumerate(paths):
    if i % 3 == 0:
        s = InferenceSession(path)
        got = s.run(None, feeds)
        s.close()
    elif i % 3 == 1:
        with InferenceSession(path) as s:
            got = s.run(None, feeds)
    else:
        s = InferenceSession(path)
        got = s.run(None, feeds)
        del s  # the finaliser
        gc.collect()
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
sequential = maps()
sessions = [InferenceSession(path) for path in paths]
opened = maps()
for s in sessions:
    s.run(None, feeds)
    s.close()
print(before, sequential, opened, maps())
"""


def test_a_hundred_sessions_on_a_hundred_plans_leave_no_mappings(generated, tmp_path):
    _, path = generated
    paths = _distinct_copies(path, tmp_path, 100)
    done = _python(MAPS, *paths)
    assert done.returncode == 0, done.stderr[-3000:]
    before, sequential, opened, after = map(int, done.stdout.split())
    kernels = len(json.loads((path / "manifest.json").read_text())["kernels"])
    assert opened - before >= 100 * kernels  # a hundred sessions open: each library mapped
    assert sequential - before <= 10 and after - before <= 10, (before, sequential, opened, after)


OPENMP_STAYS = r"""
import sys, time
import numpy as np
from tilefuse.runtime import InferenceSession
gomp = lambda: sum("libgomp" in line for line in open("/proc/self/maps"))
feeds = {"x": np.random.default_rng(2).standard_normal((64, 128)).astype(np.float32)}
assert gomp() == 0
for _ in range(3):
    with InferenceSession(sys.argv[1]) as s:
        s.run(None, feeds)  # the pool's worker threads start, and stay after the region
    time.sleep(0.05)        # they spin, then sleep, inside the pinned kernel library
    print(gomp(), end=" ")
"""


def test_kernels_run_on_tilefuse_pool_and_closing_them_leaves_its_workers_code_mapped(generated):
    """Parallel kernels run on tilefuse's own pool (codegen/cpu/threads.py), never on
    libgomp; the library whose pool the process uses pins itself (RTLD_NODELETE), so
    closing every session under its idle workers does not crash the process."""
    _, path = generated
    done = _python(OPENMP_STAYS, path)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.split() == ["0", "0", "0"]  # libgomp never loaded


def test_run_after_close_is_a_clear_error_and_close_is_idempotent(generated):
    graph, path = generated
    with InferenceSession(path) as sess:
        assert not sess.closed
        first = sess.run(None, random_feeds(graph))
    assert sess.closed
    with pytest.raises(ExecutionError, match="this InferenceSession is closed"):
        sess.run(None, random_feeds(graph))
    sess.close()
    assert [o.name for o in sess.get_outputs()] == ["h0", "h1", "x_again", "table"]  # metadata stays
    assert len(first) == 4


CLOSE_DURING_RUNS = r"""
import sys, threading
import numpy as np
from tilefuse.errors import ExecutionError
from tilefuse.runtime import InferenceSession

sess = InferenceSession(sys.argv[1])
feeds = {"x": np.random.default_rng(1).standard_normal((64, 128)).astype(np.float32)}
want = sess.run(None, feeds)
outcomes, started = [], threading.Barrier(5)

def worker():
    started.wait()
    try:
        for _ in range(200):
            got = sess.run(None, feeds)
            assert all(np.array_equal(a, b) for a, b in zip(got, want))
            outcomes.append("ran")
    except ExecutionError as e:
        assert "closed" in str(e)
        outcomes.append("closed")

threads = [threading.Thread(target=worker) for _ in range(4)]
for t in threads:
    t.start()
started.wait()
sess.close()  # waits for the runs in flight; later ones are refused
for t in threads:
    t.join()
print(outcomes.count("ran"), outcomes.count("closed"))
"""


def test_close_waits_for_runs_in_flight_on_other_threads(generated):
    _, path = generated
    done = _python(CLOSE_DURING_RUNS, path)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-3000:]}"
    ran, closed = map(int, done.stdout.split())
    assert closed == 4  # every thread saw the session close, none crashed


CONCURRENT_SESSIONS = r"""
import sys, threading
import numpy as np
from tilefuse.runtime import InferenceSession

paths = sys.argv[1:]
feeds = {"x": np.random.default_rng(3).standard_normal((64, 128)).astype(np.float32)}
with InferenceSession(paths[0]) as s:
    want = s.run(None, feeds)
maps = lambda: sum(1 for _ in open("/proc/self/maps"))
before, failures = maps(), []

def worker(t):
    for i in range(t, len(paths), 4):  # each thread its own plans, all loading and unloading at once
        with InferenceSession(paths[i]) as s:
            for _ in range(3):
                if not all(np.array_equal(a, b) for a, b in zip(s.run(None, feeds), want)):
                    failures.append(i)

after = []
for _ in range(3):
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after.append(maps())
print(len(failures), before, *after)
"""


def test_sessions_opened_and_closed_on_four_threads_at_once(generated, tmp_path):
    _, path = generated
    done = _python(CONCURRENT_SESSIONS, *_distinct_copies(path, tmp_path, 24))
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-3000:]}"
    failures, before, *after = map(int, done.stdout.split())
    # Threads that ran OpenMP regions leave a few cached stacks (glibc keeps up to 40 MiB of
    # them for later threads; libgomp has a pool per calling thread), how many depending on
    # how the threads overlapped: a bounded constant. 24 sessions' libraries would be 240.
    assert failures == 0 and max(after) - before <= 40, (failures, before, after)


def test_a_failed_load_leaves_no_library_behind(generated, tmp_path):
    """The second kernel is corrupt: the first, already loaded, is released again."""
    _, path = generated
    (copy,) = _distinct_copies(path, tmp_path, 1)
    m = json.loads((copy / "manifest.json").read_text())
    last = copy / m["kernels"][-1]["file"]
    code = r"""
import sys
from pathlib import Path
from tilefuse.errors import PlanError
from tilefuse.plan import load_plan
from tilefuse.runtime import InferenceSession
plan = load_plan(sys.argv[1])
maps = lambda: sum(1 for _ in open("/proc/self/maps"))
with InferenceSession(plan):
    pass
Path(sys.argv[2]).write_bytes(b"corrupt")
before = maps()
for _ in range(20):
    try:
        InferenceSession(plan)
    except PlanError as e:
        assert "sha256" in str(e)
print(before, maps())
"""
    done = _python(code, copy, last)
    assert done.returncode == 0, done.stderr[-3000:]
    before, after = map(int, done.stdout.split())
    assert after - before <= 10, (before, after)


# -- CUDA, against a recording driver --------------------------------------------------------------

class FakeCuda:
    """The CUDA driver API as CudaExecutor calls it, over host memory: every handle it
    gives out is recorded until released, so a test can see what a session still holds.
    ``fail`` names a call that returns an error instead."""

    CUresult = SimpleNamespace(CUDA_SUCCESS=0)
    CUstreamCaptureMode = SimpleNamespace(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL=1)
    CUfunction_attribute = SimpleNamespace(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=8)
    CUevent_flags = SimpleNamespace(CU_EVENT_DISABLE_TIMING=2)  # the feed-ordering event's
    INVALID = 400

    def __init__(self, fail: str = "", fail_after: int = 0) -> None:
        self.live: dict[str, set] = defaultdict(set)
        self.context_refs = 0
        self.memory: dict[int, np.ndarray] = {}
        self.images: list[bytes] = []
        self.launches = 0
        self._next = 0x1000
        self.fail, self.fail_after = fail, fail_after

    def __getattribute__(self, name: str):
        attr = object.__getattribute__(self, name)
        if name.startswith("cu") and name == object.__getattribute__(self, "fail"):
            if object.__getattribute__(self, "fail_after") <= 0:
                return lambda *args: (999,)
            self.fail_after -= 1
        return attr

    def _new(self, kind: str) -> int:
        self._next += 0x100
        self.live[kind].add(self._next)
        return self._next

    def _drop(self, kind: str, handle: int) -> tuple:
        if handle not in self.live[kind]:
            return (self.INVALID,)
        self.live[kind].remove(handle)
        return (0,)

    def cuGetErrorName(self, err):
        return (0, f"CUDA_ERROR_{err}".encode())

    def cuInit(self, flags):
        return (0,)

    def cuDeviceGet(self, index):
        return (0, index)

    def cuDevicePrimaryCtxRetain(self, dev):
        self.context_refs += 1
        return (0, "context")

    def cuDevicePrimaryCtxRelease(self, dev):
        self.context_refs -= 1
        return (0,)

    def cuCtxSetCurrent(self, ctx):
        return (0,) if ctx == "context" else (self.INVALID,)

    def cuCtxSynchronize(self):
        return (0,)

    def cuStreamCreate(self, flags):
        return (0, self._new("stream"))

    def cuStreamDestroy(self, stream):
        return self._drop("stream", stream)

    def cuStreamSynchronize(self, stream):
        return (0,) if stream in self.live["stream"] else (self.INVALID,)

    def cuModuleLoadData(self, image):
        self.images.append(bytes(image))
        return (0, self._new("module"))

    def cuModuleUnload(self, module):
        return self._drop("module", module)

    def cuModuleGetFunction(self, module, name):
        return (0, ("function", module, name)) if module in self.live["module"] else (self.INVALID,)

    def cuFuncSetAttribute(self, fn, attr, value):
        return (0,)

    def cuMemAlloc(self, nbytes):
        block = np.zeros(nbytes, np.uint8)
        ptr = block.ctypes.data
        self.memory[ptr] = block
        self.live["memory"].add(ptr)
        return (0, ptr)

    def cuMemFree(self, ptr):
        self.memory.pop(ptr, None)
        return self._drop("memory", ptr)

    def _copy(self, dst, src, nbytes, *stream):
        ctypes.memmove(dst, src, nbytes)
        return (0,)

    cuMemcpyHtoDAsync = cuMemcpyDtoHAsync = cuMemcpyDtoDAsync = cuMemcpyDtoH = _copy

    def cuStreamBeginCapture(self, stream, mode):
        return (0,)

    def cuStreamEndCapture(self, stream):
        return (0, self._new("graph"))

    def cuGraphInstantiate(self, graph, flags):
        return (0, self._new("graph_exec"))

    def cuGraphDestroy(self, graph):
        return self._drop("graph", graph)

    def cuGraphExecDestroy(self, graph_exec):
        return self._drop("graph_exec", graph_exec)

    def cuGraphLaunch(self, graph_exec, stream):
        return (0,) if graph_exec in self.live["graph_exec"] else (self.INVALID,)

    def cuLaunchKernel(self, fn, *args):
        self.launches += 1
        return (0,)

    def cuEventCreate(self, flags):
        return (0, self._new("event"))

    def cuEventDestroy(self, event):
        return self._drop("event", event)

    def cuEventRecord(self, event, stream):
        return (0,)

    def cuStreamWaitEvent(self, stream, event, flags):
        return (0,)

    def CUstream(self, handle):
        return handle

    def cuMemHostAlloc(self, nbytes, flags):
        block = np.zeros(nbytes, np.uint8)
        self.memory[block.ctypes.data] = block
        self.live["pinned"].add(block.ctypes.data)
        return (0, block.ctypes.data)

    def cuMemFreeHost(self, ptr):
        self.memory.pop(ptr, None)
        return self._drop("pinned", ptr)

    def cuEventSynchronize(self, event):
        return (0,)

    def cuEventElapsedTime(self, start, stop):
        return (0, 0.5)

    def held(self) -> dict[str, int]:
        """What is still allocated, by kind, and the context's references."""
        out = {kind: len(handles) for kind, handles in self.live.items() if handles}
        if self.context_refs:
            out["context"] = self.context_refs
        return out


@pytest.fixture
def fake_cuda(monkeypatch):
    from tilefuse.runtime import cuda

    fake = FakeCuda()
    monkeypatch.setattr(cuda, "_driver", lambda: fake)
    return fake


@pytest.fixture(scope="module")
def cuda_plan(tmp_path_factory):
    from tilefuse.plan import load_plan

    tmp = tmp_path_factory.mktemp("cuda")
    graph, plan = cuda_mlp_plan(tmp / "build")
    return graph, load_plan(plan.save(tmp / "mlp.tfplan"))


def test_a_cuda_session_releases_every_device_resource(fake_cuda, cuda_plan):
    graph, plan = cuda_plan
    sess = InferenceSession(plan)
    held = fake_cuda.held()
    assert held["module"] == 2 and held["stream"] == 1 and held["graph_exec"] == 1 and held["context"] == 1
    assert "graph" not in held  # the captured graph is dropped once instantiated
    assert sorted(fake_cuda.images) == sorted(k.path.read_bytes() for k in plan.kernels.values())
    feeds = random_feeds(graph, seed=4)
    x_again = sess.run(["x_again"], feeds)[0]
    np.testing.assert_array_equal(x_again, feeds["x"])  # copied in and out through "device" memory
    assert held["event"] == 2  # the ones that order device feeds and a run not waited for, for the session's life
    sess._executor.timed(3)
    sess._executor.timed_steps(2)
    assert len(sess.step_times(feeds)) == len(plan.steps)  # a profile's run: events per step
    assert fake_cuda.held()["event"] == 2  # timing events are destroyed after each use
    sess.close()
    assert fake_cuda.held() == {}
    with pytest.raises(ExecutionError, match="closed"):
        sess.run(None, feeds)
    sess.close()
    assert fake_cuda.held() == {}


def test_a_hundred_cuda_sessions_hold_nothing_once_closed_or_dropped(fake_cuda, cuda_plan):
    graph, plan = cuda_plan
    feeds = random_feeds(graph)
    for i in range(100):
        if i % 2:
            with InferenceSession(plan) as sess:
                sess.run(None, feeds)
        else:
            sess = InferenceSession(plan)
            sess.run(None, feeds)
            del sess
            gc.collect()
        assert fake_cuda.held() == {}, i


class _DeviceTensor:
    """A "GPU" tensor for the fake driver: host memory named by __cuda_array_interface__,
    holding a copy of ``a``. Its address is 8 past a multiple of 256 unless ``aligned``: a
    binding uses 256-aligned memory in place, where the fake's kernels write nothing, and
    copies other memory in and out, which the fake does (numpy's own arrays are 256-aligned
    by chance, one time in a few, which made a test of the copies fail now and then)."""

    def __init__(self, a: np.ndarray, aligned: bool = False) -> None:
        raw = np.zeros(a.nbytes + 512, np.uint8)
        start = -raw.ctypes.data % 256 + (0 if aligned else 8)
        self.a = raw[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
        self.a[...] = a
        assert (self.a.ctypes.data % 256 == 0) == aligned

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.a.shape, "typestr": self.a.dtype.str, "data": (self.a.ctypes.data, False), "version": 3}


def test_device_outputs_keep_the_context_until_they_are_freed(fake_cuda, cuda_plan):
    graph, plan = cuda_plan
    feeds = random_feeds(graph, seed=5)
    sess = InferenceSession(plan)
    (y,) = sess.run(["x_again"], {"x": _DeviceTensor(feeds["x"])})
    assert isinstance(y, DeviceArray)
    sess.close()
    assert fake_cuda.held() == {"memory": 1, "context": 1}  # the output's memory, and what frees it
    np.testing.assert_array_equal(y.numpy(), feeds["x"])  # still readable after the session closed
    del y
    gc.collect()
    assert fake_cuda.held() == {}


@pytest.mark.parametrize("fail, after", [("cuModuleLoadData", 1), ("cuMemAlloc", 3), ("cuGraphInstantiate", 0)])
def test_a_failed_cuda_load_releases_what_it_took(monkeypatch, cuda_plan, fail, after):
    from tilefuse.runtime import cuda

    fake = FakeCuda(fail, after)
    monkeypatch.setattr(cuda, "_driver", lambda: fake)
    with pytest.raises(ExecutionError, match=f"CUDA {fail}.* failed: CUDA_ERROR_999"):
        InferenceSession(cuda_plan[1])
    assert fake.held() == {}


def test_a_cuda_kernel_changed_after_load_plan_is_not_loaded(fake_cuda, cuda_plan, tmp_path):
    from tilefuse.plan import load_plan

    graph, plan = cuda_plan
    path = tmp_path / "copy.tfplan"
    plan_copy = load_plan(plan.save(path))
    kernel = next(iter(plan_copy.kernels.values()))
    kernel.path.write_bytes(b"something else")
    with pytest.raises(PlanError, match="sha256 .* the file was modified"):
        InferenceSession(plan_copy)
    assert fake_cuda.images == [] and fake_cuda.held() == {}


def test_a_binding_runs_on_its_memory_and_goes_with_the_session(fake_cuda, cuda_plan):
    """A binding's graph is the executor's until the session closes (or it is released);
    its own output memory goes with its array."""
    graph, plan = cuda_plan
    feeds = random_feeds(graph, seed=6)
    sess = InferenceSession(plan)
    before = fake_cuda.held()["graph_exec"]
    x = _DeviceTensor(feeds["x"].copy())
    out = _DeviceTensor(np.zeros_like(feeds["x"]))
    bound = sess.bind({"x": x}, {"x_again": out})
    assert fake_cuda.held()["graph_exec"] == before + 1
    bound.run()  # (this fake copies at capture: what a replay reads is test_cuda_index_status's)
    np.testing.assert_array_equal(out.a, feeds["x"])  # written into the bound output
    own = sess.bind({"x": x}, ["x_again"])
    own.run()
    np.testing.assert_array_equal(own.outputs[0].numpy(), feeds["x"])
    # 256-aligned input memory is used in place (the kernels read it there, no copy in), and
    # an output that is that input (no kernel writes it) is copied from there: it was copied
    # from the input's arena buffer, which a bound run leaves unwritten (zeros, or an earlier
    # run's values on a GPU)
    for out_aligned in (False, True):
        fresh = InferenceSession(plan)  # an arena no earlier run has written
        got = _DeviceTensor(np.zeros_like(feeds["x"]), aligned=out_aligned)
        inplace = fresh.bind({"x": _DeviceTensor(feeds["x"], aligned=True)}, {"x_again": got})
        assert not inplace._in and len(inplace._moved) == 1 and [c.what for c in inplace._out] == ["output x_again"]
        inplace.run()
        np.testing.assert_array_equal(got.a, feeds["x"])
        fresh.close()
    bound.release()
    assert fake_cuda.held()["graph_exec"] == before + 1
    sess.close()
    assert fake_cuda.held() == {"memory": 1, "context": 1}  # the binding's own output, until it goes
    del own
    gc.collect()
    assert fake_cuda.held() == {}


def test_the_drop_in_io_binding_binds_gpu_buffers_once(fake_cuda, cuda_plan):
    """onnxruntime's IOBinding with CUDA buffers (pointers, as torch's data_ptr() gives):
    bound once, run as the plan session's binding, outputs in the caller's buffer or in
    memory the session keeps; rebinding makes a new binding."""
    import tilefuse

    graph, plan = cuda_plan
    feeds = random_feeds(graph, seed=7)
    sess = tilefuse.InferenceSession(plan)
    x = feeds["x"].copy()
    out = np.zeros_like(x)
    b = sess.io_binding()
    b.bind_input("x", "cuda", 0, np.float32, x.shape, x.ctypes.data)
    b.bind_output("x_again", "cuda", 0, np.float32, out.shape, out.ctypes.data)
    sess.run_with_iobinding(b)
    np.testing.assert_array_equal(out, feeds["x"])
    (value,) = b.get_outputs()
    assert value.device_name() == "cuda" and value.data_ptr() == out.ctypes.data and value.shape() == list(x.shape)
    np.testing.assert_array_equal(b.copy_outputs_to_cpu()[0], feeds["x"])
    first = b._device
    sess.run_with_iobinding(b)
    assert b._device is first  # the same binding: nothing is checked or captured again
    b.clear_binding_outputs()
    b.bind_output("x_again", "cuda")  # memory the session keeps
    sess.run_with_iobinding(b)
    assert b._device is not first
    np.testing.assert_array_equal(b.get_outputs()[0].numpy(), feeds["x"])
    # run options asking for no synchronisation: the bound run is queued, and
    # synchronize_outputs waits for it (the plan session's synchronize)
    import onnxruntime

    waits, syncs = [], []
    run = b._device.run
    b._device.run = lambda stream=None, wait=True: waits.append(wait) or run(stream, wait)
    plan_session = b._plan_session()
    sync = plan_session.synchronize
    plan_session.synchronize = lambda: syncs.append(1) or sync()
    unsynced = onnxruntime.RunOptions()
    unsynced.add_run_config_entry("disable_synchronize_execution_providers", "1")
    sess.run_with_iobinding(b, unsynced)
    b.synchronize_outputs()
    sess.run_with_iobinding(b)
    assert waits == [False, True] and syncs == [1]
    np.testing.assert_array_equal(b.copy_outputs_to_cpu()[0], feeds["x"])
    sess.close()
