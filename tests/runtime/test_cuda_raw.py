"""The steady run's raw driver calls (runtime/cuda_raw.py) against a stand-in of the CUDA
driver library's C interface, built here with the C compiler: handles reach the driver
as the pointers they are (values past 32 bits included), each call's CUresult comes back
as an int, the context is made current only where it is not, ordering records the event
on the caller's stream before the plan's stream waits on it, and a library that cannot be
loaded or lacks an entry point gives None (the steady run then uses cuda-bindings)."""
from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest

from tilefuse.runtime.cuda_raw import RawDriver

STANDIN = r"""
#include <stdint.h>
/* each call appends (call number, its arguments) to calls; fail_at: the call number that fails */
int64_t calls[64][4];
int ncalls = 0, fail_at = -1, fail_code = 0;
void *current = 0;
static int log4(int64_t what, int64_t a, int64_t b, int64_t c) {
    calls[ncalls][0] = what; calls[ncalls][1] = a; calls[ncalls][2] = b; calls[ncalls][3] = c;
    return ncalls++ == fail_at ? fail_code : 0;
}
int cuCtxGetCurrent(void **ctx) { *ctx = current; return log4(1, 0, 0, 0); }
int cuCtxSetCurrent(void *ctx) { current = ctx; return log4(2, (int64_t)ctx, 0, 0); }
int cuEventRecord(void *event, void *stream) { return log4(3, (int64_t)event, (int64_t)stream, 0); }
int cuStreamWaitEvent(void *stream, void *event, unsigned flags) { return log4(4, (int64_t)stream, (int64_t)event, flags); }
int cuGraphLaunch(void *graph, void *stream) { return log4(5, (int64_t)graph, (int64_t)stream, 0); }
int cuStreamSynchronize(void *stream) { return log4(6, (int64_t)stream, 0, 0); }
"""

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="needs a C compiler")


@pytest.fixture
def lib(tmp_path):
    src = tmp_path / "standin.c"
    src.write_text(STANDIN)
    so = tmp_path / "libstandin.so"
    subprocess.run([shutil.which("cc") or "gcc", "-shared", "-fPIC", "-O1", str(src), "-o", str(so)], check=True)
    return ctypes.CDLL(str(so))


def _calls(lib) -> list[tuple[int, ...]]:
    table = (ctypes.c_int64 * 4 * 64).in_dll(lib, "calls")
    return [tuple(table[i]) for i in range(ctypes.c_int.in_dll(lib, "ncalls").value)]


CTX, STREAM, EVENT, GRAPH, CALLER = 0x7F12_3456_7000, 0x7F12_0000_1000, 0x5500_0000_0040, 0x7FFF_FFFF_F000, 0x1


def test_the_calls_reach_the_driver_as_pointers(lib):
    raw = RawDriver(lib)
    assert raw.ensure_current(CTX) == 0  # not current: get, then set
    assert raw.ensure_current(CTX) == 0  # current: get only
    assert raw.order(EVENT, CALLER, STREAM) == 0
    assert raw.launch(GRAPH, STREAM) == 0
    assert raw.synchronize(STREAM) == 0
    assert _calls(lib) == [(1, 0, 0, 0), (2, CTX, 0, 0), (1, 0, 0, 0), (3, EVENT, CALLER, 0), (4, STREAM, EVENT, 0),
                           (5, GRAPH, STREAM, 0), (6, STREAM, 0, 0)]


@pytest.mark.parametrize("fail_at, code", [(0, 201), (2, 400), (3, 700)])
def test_a_failed_call_gives_its_code_and_ordering_stops_there(lib, fail_at, code):
    raw = RawDriver(lib)
    ctypes.c_int.in_dll(lib, "fail_at").value, ctypes.c_int.in_dll(lib, "fail_code").value = fail_at, code
    results = [raw.ensure_current(CTX), raw.order(EVENT, CALLER, STREAM)]
    assert code in results
    if fail_at == 2:  # the event's record failed: the stream does not wait on it
        assert [c[0] for c in _calls(lib)] == [1, 2, 3]


def test_a_library_that_is_missing_or_incomplete_gives_none(tmp_path):
    assert RawDriver.load(str(tmp_path / "libcuda-absent.so")) is None
    src = tmp_path / "partial.c"
    src.write_text("int cuCtxGetCurrent(void **c) { *c = 0; return 0; }\n")
    so = tmp_path / "libpartial.so"
    subprocess.run([shutil.which("cc") or "gcc", "-shared", "-fPIC", str(src), "-o", str(so)], check=True)
    assert RawDriver.load(str(so)) is None
