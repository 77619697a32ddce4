"""The thread pool the CPU kernels' parallel loops run on (codegen/cpu/threads.py): every
share of a region runs exactly once whoever runs it; the team size is per calling thread and
one pool serves every kernel library; a nested region, or one entered while another caller
has the pool, runs alone; after a share stalls (its thread off the core) regions run on the
calling thread for a while; a host set on the calling thread (onnxruntime's intra-op pool)
runs a region's shares instead, each once; idle pool threads sleep; a kernel needs no
OpenMP runtime; a forked child still runs parallel kernels."""
import ctypes
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tilefuse.codegen.cpu import build_kernel
from tilefuse.codegen.cpu.build import find_compiler, flags
from tilefuse.codegen.cpu.prelude import PRELUDE
from tilefuse.codegen.cpu.threads import THREAD_POOL
from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ScalarFn as F
from tilefuse.tile_ir.ir import Call

from tests.codegen.cpu_programs import elementwise, load, param, program, run_both
from tests.plan.handmade import default_team

ROOT = Path(__file__).resolve().parents[2]

KERNELS = r"""
/* each iteration adds 1 to its slot */
void count(int32_t *slots, int64_t n) {
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) slots[i] += 1;
}
/* per iteration: the team size and the share that ran it */
void shares(int32_t *team, int32_t *share, int64_t n) {
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) { team[i] = omp_get_num_threads(); share[i] = omp_get_thread_num(); }
}
static void __attribute__((noinline)) inner(int32_t *team, int64_t n) {
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) team[i] = omp_get_num_threads();
}
/* a region inside a region's share */
void nested(int32_t *outer, int32_t *inner_team, int64_t n) {
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) { outer[i] = omp_get_num_threads(); inner(inner_team + i * n, n); }
}
/* a region of two shares: share 0 waits (at most wait_us) for share 1 to begin on another
 * thread, then share `slow` sleeps `us` microseconds; tid[i]: the thread that ran share i.
 * The wait spins: polling with usleep(100) overslept by a millisecond on a busy VM, and
 * the caller's share then looked stalled to the pool (the workers had waited for it) */
static int64_t since_us(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)(t.tv_sec - t0->tv_sec) * 1000000 + (t.tv_nsec - t0->tv_nsec) / 1000;
}
void stall(int64_t slow, int64_t us, int64_t wait_us, int64_t *tid) {
    _Atomic int begun = 0;
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < 2; i++) {
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (i == 1) atomic_store(&begun, 1);
        else while (!atomic_load(&begun) && since_us(&t0) < wait_us) {}
        if (i == slow) usleep((useconds_t)us);
        tid[i] = (int64_t)syscall(SYS_gettid);
    }
}
/* a region with a stall, then at once one without */
void stall_then_not(int64_t slow, int64_t us, int64_t wait_us, int64_t *first, int64_t *then) {
    stall(slow, us, wait_us, first);
    stall(slow, 0, wait_us, then);
}
/* each share counts itself in, then waits for *go: holds the pool until released */
void hold(_Atomic int32_t *go, _Atomic int32_t *entered) {
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < 2; i++) { atomic_fetch_add(entered, 1); while (!atomic_load(go)) sched_yield(); }
}
"""


def _build(tmp: Path, name: str) -> Path:
    src, lib = tmp / f"{name}.c", tmp / f"{name}.so"
    src.write_text(THREAD_POOL + PRELUDE + KERNELS)
    subprocess.run([*find_compiler().command, *flags("native"), "-o", str(lib), str(src)], check=True)
    return lib


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pool")
    return [ctypes.CDLL(str(_build(tmp, name)), mode=ctypes.RTLD_LOCAL) for name in ("a", "b")]


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    """The array's address: the caller keeps the array alive."""
    return ctypes.c_void_p(a.ctypes.data)


def test_every_share_runs_once_from_many_callers_and_team_sizes(libs):
    lib = libs[0]
    failures = []

    def caller(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(200):
            lib.tf_threads_set(int(rng.integers(1, 6)))
            slots = np.zeros(int(rng.integers(1, 5000)), np.int32)
            rounds = int(rng.integers(1, 10))
            for _ in range(rounds):
                lib.count(_ptr(slots), ctypes.c_int64(slots.size))
            if not (slots == rounds).all():
                failures.append((seed, slots.size, rounds))

    threads = [threading.Thread(target=caller, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_team_size_is_per_calling_thread_and_one_pool_serves_every_library(libs):
    a, b = libs
    n = 1000
    team, share = np.zeros(n, np.int32), np.full(n, -1, np.int32)
    a.tf_threads_set(3)  # set through one library, used by the other's kernels
    b.shares(_ptr(team), _ptr(share), ctypes.c_int64(n))
    assert (team == 3).all() and b.tf_threads_team() == 3
    # the static schedule's shares: three contiguous runs of rows, 0, 1, 2 in order
    assert list(np.unique(share)) == [0, 1, 2] and (np.diff(share) >= 0).all()

    seen = {}

    def fresh_thread() -> None:  # its own team size: the default, whatever the caller set
        t, s = np.zeros(n, np.int32), np.zeros(n, np.int32)
        b.shares(_ptr(t), _ptr(s), ctypes.c_int64(n))
        seen["team"], seen["default"] = set(t.tolist()), a.tf_threads_default()

    worker = threading.Thread(target=fresh_thread)
    worker.start()
    worker.join()
    assert seen == {"team": {default_team()}, "default": default_team()}
    a.tf_threads_set(1)
    b.shares(_ptr(team), _ptr(share), ctypes.c_int64(n))
    assert (team == 1).all() and (share == 0).all()


def test_a_region_inside_a_share_runs_alone(libs):
    lib = libs[1]
    lib.tf_threads_set(2)
    n = 64
    outer, inner = np.zeros(n, np.int32), np.zeros(n * n, np.int32)
    lib.nested(_ptr(outer), _ptr(inner), ctypes.c_int64(n))
    assert (outer == 2).all() and (inner == 1).all()


def test_a_caller_that_finds_the_pool_busy_runs_alone(libs):
    a, b = libs
    go, entered = ctypes.c_int32(0), ctypes.c_int32(0)

    def holder() -> None:
        a.tf_threads_set(2)
        a.hold(ctypes.byref(go), ctypes.byref(entered))

    t = threading.Thread(target=holder)
    t.start()
    try:
        deadline = time.monotonic() + 30
        while entered.value == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert entered.value > 0, "the holding region never started"
        b.tf_threads_set(2)
        team, share = np.zeros(100, np.int32), np.zeros(100, np.int32)
        b.shares(_ptr(team), _ptr(share), ctypes.c_int64(100))
        assert (team == 1).all()  # it did not wait for the pool: it ran every iteration itself
    finally:
        go.value = 1
        t.join()


@pytest.mark.parametrize("slow", [1, 0], ids=["a worker's share", "the caller's share"])
def test_after_a_stalled_share_regions_run_on_the_caller_for_a_while(libs, slow):
    """A share whose thread is off its core (here: asleep for 20 ms) holds up the region's end:
    the next regions run every share on the calling thread, numbered as before; later ones
    run on the pool again."""
    lib = libs[0]
    lib.tf_threads_set(2)
    caller = threading.get_native_id()
    first, then = np.zeros(2, np.int64), np.zeros(2, np.int64)
    tries = []
    for _ in range(5):  # a region whose worker never began its share in 50 ms did not stall
        lib.stall_then_not(ctypes.c_int64(slow), ctypes.c_int64(20_000), ctypes.c_int64(50_000), _ptr(first), _ptr(then))
        tries.append((first.tolist(), then.tolist()))
        if first[1] != caller:  # the stalled region ran on the pool: the next one on the caller
            break
    assert first[1] != caller and (then == caller).all(), tries
    team, share = np.zeros(100, np.int32), np.full(100, -1, np.int32)
    lib.shares(_ptr(team), _ptr(share), ctypes.c_int64(100))
    assert (team == 2).all() and list(np.unique(share)) == [0, 1]  # the same shares, in turn
    # past the longest time on the caller, regions without stalls use the pool (a loaded box
    # stalls some of these too, each doubling the time on the caller: up to 12 s of tries)
    for _ in range(60):
        time.sleep(0.2)
        lib.stall_then_not(ctypes.c_int64(slow), ctypes.c_int64(0), ctypes.c_int64(1_000_000), _ptr(first), _ptr(then))
        if first[1] != caller and then[1] != caller:
            break
    assert first[1] != caller and then[1] != caller


SHARE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t)
HOST = ctypes.CFUNCTYPE(None, ctypes.c_void_p, SHARE, ctypes.c_size_t, ctypes.c_void_p)


class Host:
    """A host of parallel regions (``tf_threads_host``) in Python: runs the indices
    ``pick(n)`` chooses, each on a thread of its own, and records what it was given."""

    def __init__(self, pick=lambda n: range(n)) -> None:
        self.calls: list[int] = []
        self.threads: set[int] = set()
        self._pick = pick
        self.run = HOST(self._run)

    def _run(self, host, share, n, arg) -> None:
        self.calls.append(n)

        def one(i: int) -> None:
            self.threads.add(threading.get_ident())
            share(arg, i)

        workers = [threading.Thread(target=one, args=(i,)) for i in self._pick(n)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()


@pytest.fixture
def hosted(libs):
    """``hosted(lib, host)``: set ``host`` on this thread, cleared (with the team) after the test."""
    used = []

    def set_host(lib, host: Host | None) -> None:
        lib.tf_threads_host.argtypes = [HOST, ctypes.c_void_p]
        lib.tf_threads_host(host.run if host else HOST(), None)
        used.append(lib)

    yield set_host
    for lib in used:
        lib.tf_threads_host(HOST(), None)
        lib.tf_threads_set(0)


def test_a_host_runs_the_shares_with_their_numbers(libs, hosted):
    a, b = libs
    host = Host()
    a.tf_threads_set(3)
    hosted(a, host)  # set through one library, used by the other's kernels: one pool
    n = 1000
    team, share = np.zeros(n, np.int32), np.full(n, -1, np.int32)
    b.shares(_ptr(team), _ptr(share), ctypes.c_int64(n))
    assert host.calls == [3] and threading.get_ident() not in host.threads  # on the host's threads
    assert (team == 3).all() and list(np.unique(share)) == [0, 1, 2] and (np.diff(share) >= 0).all()
    outer, inner = np.zeros(64, np.int32), np.zeros(64 * 64, np.int32)
    b.nested(_ptr(outer), _ptr(inner), ctypes.c_int64(64))  # a region inside a share runs alone
    assert host.calls == [3, 3] and (outer == 3).all() and (inner == 1).all()


def test_shares_a_host_skips_or_repeats_run_once(libs, hosted):
    """A host that failed part way (onnxruntime's parallel-for returned an error) leaves
    shares unrun: the calling thread runs them; one handed out twice runs once."""
    lib = libs[0]
    lib.tf_threads_set(4)
    for pick in (lambda n: [2], lambda n: [], lambda n: [1, 1, 3, 0, 3, 99]):
        host = Host(pick)
        hosted(lib, host)
        slots = np.zeros(4000, np.int32)
        lib.count(_ptr(slots), ctypes.c_int64(slots.size))
        assert host.calls == [4] and (slots == 1).all()


def test_the_host_is_per_calling_thread_and_cleared_by_null(libs, hosted):
    lib = libs[0]
    host = Host()
    hosted(lib, host)
    lib.tf_threads_set(2)
    slots = np.zeros(100, np.int32)
    other = threading.Thread(target=lambda: (lib.tf_threads_set(2), lib.count(_ptr(slots), ctypes.c_int64(100))))
    other.start()
    other.join()
    assert host.calls == [] and (slots == 1).all()  # that thread has no host: the pool ran it
    lib.tf_threads_set(1)
    lib.count(_ptr(slots), ctypes.c_int64(100))
    assert host.calls == []  # a team of one runs inline, without the host
    lib.tf_threads_set(2)
    hosted(lib, None)
    lib.count(_ptr(slots), ctypes.c_int64(100))
    assert host.calls == [] and (slots == 3).all()


TASK = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class ThreadsV1(ctypes.Structure):
    """struct tf_threads_v1, the pool as libraries built before the host hook see it."""
    _fields_ = [("parallel", ctypes.CFUNCTYPE(None, TASK, ctypes.c_void_p, ctypes.c_uint)),
                ("thread_num", ctypes.CFUNCTYPE(ctypes.c_int)), ("num_threads", ctypes.CFUNCTYPE(ctypes.c_int)),
                ("set", ctypes.CFUNCTYPE(None, ctypes.c_int)), ("team", ctypes.CFUNCTYPE(ctypes.c_int)),
                ("fallback", ctypes.CFUNCTYPE(ctypes.c_int))]


def test_the_v1_interface_keeps_its_meaning(libs, hosted):
    """An older library finds the pool through tf_threads_v1: its regions run on the pool
    even while the calling thread has a host (that library never sets one)."""
    lib = libs[0]
    lib.tf_threads_v1.restype = ctypes.POINTER(ThreadsV1)
    v1 = lib.tf_threads_v1().contents
    host = Host()
    hosted(lib, host)
    shares = []
    task = TASK(lambda data: shares.append((v1.thread_num(), v1.num_threads())))
    v1.parallel(task, None, 2)
    assert host.calls == [] and sorted(shares) == [(0, 2), (1, 2)]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads thread states from /proc")
def test_idle_pool_threads_sleep(libs):
    lib = libs[0]
    lib.tf_threads_set(3)
    slots = np.zeros(10_000, np.int32)
    lib.count(_ptr(slots), ctypes.c_int64(slots.size))
    time.sleep(0.2)  # far past the spin
    states = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().strip() == "tilefuse-pool":
                states[task.name] = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
    assert len(states) >= 2 and set(states.values()) == {"S"}, states


def _parallel_program():
    x = param("x", DType.FLOAT32, (512, 512))
    y = param("y", DType.FLOAT32, (512, 512))
    body = [elementwise(y, lambda i: Call(F.MUL, (load(x, i), load(x, i)), DType.FLOAT32))]
    return program("square", [x], [y], body)


def test_a_parallel_kernel_runs_without_an_openmp_runtime(tmp_path):
    p = _parallel_program()
    artifact = build_kernel(p, cache_dir=tmp_path)
    text = Path(artifact.source).read_text()
    assert "#pragma omp parallel" in text and "tf_threads_v1" in text
    script = f"""
import ctypes, json, os, numpy as np
lib = ctypes.CDLL({str(artifact.path)!r}, mode=ctypes.RTLD_LOCAL)
lib.tf_threads_set(2)
x = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
y = np.zeros_like(x)
argv = (ctypes.c_void_p * 2)(x.ctypes.data, y.ctypes.data)
getattr(lib, {artifact.symbol!r})(argv)
try:
    ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD)
    gomp = True
except OSError:
    gomp = False
print(json.dumps({{"gomp": gomp, "ok": bool(np.array_equal(y, x * x))}}))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout) == {"gomp": False, "ok": True}


def test_a_kernel_without_parallel_loops_carries_no_pool(tmp_path):
    x = param("x", DType.FLOAT32, (4, 8))
    y = param("y", DType.FLOAT32, (4, 8))
    p = program("small", [x], [y], [elementwise(y, lambda i: Call(F.NEG, (load(x, i),), DType.FLOAT32))])
    artifact = build_kernel(p, cache_dir=tmp_path)
    assert "tf_threads_v1" not in Path(artifact.source).read_text()
    got, want = run_both(p, artifact, [np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)])
    np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_runs_parallel_kernels(libs, tmp_path):
    lib_path = _build(tmp_path, "forked")
    script = f"""
import ctypes, os, numpy as np
lib = ctypes.CDLL({str(lib_path)!r}, mode=ctypes.RTLD_LOCAL)
lib.tf_threads_set(3)
def run():
    slots = np.zeros(100_000, np.int32)
    for _ in range(50):
        lib.count(ctypes.c_void_p(slots.ctypes.data), ctypes.c_int64(slots.size))
    return bool((slots == 50).all())
assert run()  # the parent's workers exist now
pid = os.fork()
if pid == 0:
    os._exit(0 if run() else 3)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "0"
