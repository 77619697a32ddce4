"""The compiler driver: the kernel cache (counted compiler runs, not timings), parallel
builds into one cache, entries verified before use, and compile errors that name the
kernel, its source and the compiler's message."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.codegen.cpu_programs import elementwise, load, param, program
from tilefuse.codegen.cpu import build_all, build_kernel, emit_program
from tilefuse.codegen.cpu.call import call_kernel
from tilefuse.codegen.toolchain import digest_path, entry_ok
from tilefuse.errors import CompileError
from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ScalarFn
from tilefuse.tile_ir.ir import Call

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
F32 = DType.FLOAT32
REPO = Path(__file__).resolve().parents[2]


def _unary(name: str, fn: ScalarFn, n: int = 32):
    x, out = param("x", F32, (n,)), param("out", F32, (n,))
    return program(name, [x], [out], [elementwise(out, lambda i: Call(fn, (load(x, i),), F32))])


@pytest.fixture
def compiler_runs(tmp_path, monkeypatch):
    """Puts a counting wrapper around cc in $CC; returns how many compiles it has run."""
    log = tmp_path / "cc.log"
    wrapper = tmp_path / "counting-cc"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> "{log}"\nexec "{shutil.which("cc")}" "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CC", str(wrapper))
    return lambda: sum("-shared" in line for line in log.read_text().splitlines()) if log.exists() else 0


def test_second_build_runs_no_compiler_and_identical_layers_build_once(tmp_path, compiler_runs):
    programs = [_unary("k0_exp", ScalarFn.EXP), _unary("k1_tanh", ScalarFn.TANH), _unary("k2_erf", ScalarFn.ERF),
                _unary("k3_exp", ScalarFn.EXP)]  # k3 is k0 again: another layer of the same shape
    cache = tmp_path / "kernels"
    first = build_all(programs, jobs=2, cache_dir=cache)
    assert compiler_runs() == 3
    assert first[0].path == first[3].path and first[0].symbol == first[3].symbol
    second = build_all(programs, jobs=2, cache_dir=cache)
    assert compiler_runs() == 3
    assert [a.path for a in second] == [a.path for a in first]
    assert build_kernel(programs[1], cache_dir=cache).path == first[1].path
    assert compiler_runs() == 3
    assert all(a.path.exists() and a.source is not None and a.source.exists() for a in second)
    assert not list(cache.glob(".*"))  # no temporary files left behind
    x = np.linspace(-2, 2, 32, dtype=np.float32)
    out = np.zeros(32, np.float32)
    call_kernel(second[1], [x, out])
    np.testing.assert_allclose(out, np.tanh(x), rtol=1e-6)


def test_concurrent_builds_of_one_kernel_into_one_cache(tmp_path):
    p = _unary("k0_sqrt", ScalarFn.SQRT)
    results, errors = [], []

    def build():
        try:
            results.append(build_kernel(p, cache_dir=tmp_path))
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=build) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len({a.path for a in results}) == 1
    assert len(list(tmp_path.glob("*.so"))) == 1 and not list(tmp_path.glob(".*"))


def test_compiler_failure_names_kernel_source_and_compiler_message(tmp_path, monkeypatch):
    import tilefuse.codegen.cpu.emit as emit

    monkeypatch.setattr(emit, "PRELUDE", emit.PRELUDE + "\nthis_is_not_c = ;\n")
    p = _unary("k5_broken", ScalarFn.EXP)
    symbol = emit_program(p).symbol
    with pytest.raises(CompileError) as info:
        build_kernel(p, cache_dir=tmp_path)
    message = str(info.value)
    (source,) = tmp_path.glob("*.c")
    assert f"kernel {symbol}" in message
    assert str(source) in message and "this_is_not_c" in source.read_text()
    assert "error" in message and "this_is_not_c" in message  # the compiler's own words
    assert not list(tmp_path.glob("*.so"))


def test_missing_compiler_is_a_clear_compile_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "no-such-cc-tilefuse")
    with pytest.raises(CompileError, match="no C compiler found.*no-such-cc-tilefuse"):
        build_kernel(_unary("k0_exp", ScalarFn.EXP), cache_dir=tmp_path)


def test_call_kernel_checks_arrays(tmp_path):
    art = build_kernel(_unary("k0_neg", ScalarFn.NEG), cache_dir=tmp_path)
    with pytest.raises(ValueError, match="param x is float32"):
        call_kernel(art, [np.zeros(32, np.float64), np.zeros(32, np.float32)])
    with pytest.raises(ValueError, match="2 params"):
        call_kernel(art, [np.zeros(32, np.float32)])


# -- a cache entry is verified before use (issue 15, item 4) ------------------------------------

REBUILD_AND_CALL = """
import sys
from pathlib import Path
import numpy as np
from tests.codegen.test_cpu_build import _unary
from tilefuse.codegen.cpu import build_kernel
from tilefuse.codegen.cpu.call import call_kernel
from tilefuse.ir.prims import ScalarFn
art = build_kernel(_unary("k0_tanh", ScalarFn.TANH), cache_dir=Path(sys.argv[1]))
x = np.linspace(-2, 2, 32, dtype=np.float32)
out = np.zeros(32, np.float32)
call_kernel(art, [x, out])
np.testing.assert_allclose(out, np.tanh(x), rtol=1e-6)
print("ok")
"""


def _rebuild_and_call(cache) -> subprocess.CompletedProcess:
    """Build (from ``cache``) and call the tanh kernel in a fresh interpreter: loading a
    broken library there may crash it (SIGBUS), not pytest."""
    return subprocess.run([sys.executable, "-c", REBUILD_AND_CALL, str(cache)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("damage", ["truncated", "a flipped byte", "no digest", "an empty file"])
def test_a_damaged_library_in_the_cache_is_rebuilt_not_loaded(tmp_path, compiler_runs, damage):
    cache = tmp_path / "kernels"
    build_kernel(_unary("k0_tanh", ScalarFn.TANH), cache_dir=cache)
    assert compiler_runs() == 1
    (lib,) = cache.glob("*.so")
    data = lib.read_bytes()
    if damage == "truncated":
        lib.write_bytes(data[: len(data) // 2])
    elif damage == "a flipped byte":
        lib.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    elif damage == "no digest":
        digest_path(lib).unlink()
    else:
        lib.write_bytes(b"")
    done = _rebuild_and_call(cache)
    assert done.returncode == 0 and "ok" in done.stdout, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert compiler_runs() == 2  # compiled again, into the same entry
    assert entry_ok(lib) and lib.read_bytes() == data


def test_a_damaged_c_file_is_rewritten_before_it_is_compiled(tmp_path):
    cache = tmp_path / "kernels"
    art = build_kernel(_unary("k0_exp", ScalarFn.EXP), cache_dir=cache)
    art.source.write_text("garbage")
    art.path.unlink()
    again = build_kernel(_unary("k0_exp", ScalarFn.EXP), cache_dir=cache)
    assert "garbage" not in again.source.read_text() and entry_ok(again.path)


def test_stale_temporary_files_are_removed_and_fresh_ones_kept(tmp_path):
    cache = tmp_path / "kernels"
    cache.mkdir()
    old, young = cache / ".k0_x-0123.abc.so.tmp", cache / ".k0_y-4567.def.so.tmp"
    for f in (old, young):
        f.write_bytes(b"half a library")
    two_hours_ago = time.time() - 2 * 3600
    os.utime(old, (two_hours_ago, two_hours_ago))
    build_kernel(_unary("k0_neg", ScalarFn.NEG), cache_dir=cache)
    assert not old.exists() and young.exists()  # a young one may be a compile running now


SLOW_BUILD = """
import sys
from pathlib import Path
from tests.codegen.test_cpu_build import _unary
from tilefuse.codegen.cpu import build_kernel
from tilefuse.ir.prims import ScalarFn
build_kernel(_unary("k0_tanh", ScalarFn.TANH), cache_dir=Path(sys.argv[1]))
"""


def test_a_killed_compile_leaves_no_entry_and_the_next_build_is_sound(tmp_path, monkeypatch):
    """SIGKILL the whole build (Python and the compiler) while the compiler runs: what it
    leaves is a temporary file, never an entry; the next build compiles afresh."""
    cache = tmp_path / "kernels"
    slow = tmp_path / "slow-cc"
    slow.write_text(f'#!/bin/sh\ncase "$*" in *-shared*) sleep 60;; esac\nexec "{shutil.which("cc")}" "$@"\n')
    slow.chmod(0o755)
    build = subprocess.Popen([sys.executable, "-c", SLOW_BUILD, str(cache)], cwd=REPO, start_new_session=True,
                             env={**os.environ, "CC": str(slow)}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not list(cache.glob(".*.so.tmp")) and time.time() < deadline:
            time.sleep(0.1)
        assert list(cache.glob(".*.so.tmp")), "the build never started compiling"
    finally:
        os.killpg(build.pid, signal.SIGKILL)
        build.wait()
    assert not list(cache.glob("*.so"))
    done = _rebuild_and_call(cache)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]
    (lib,) = cache.glob("*.so")
    assert entry_ok(lib)


RACE = """
import sys
from pathlib import Path
from tests.codegen.test_cpu_build import _unary
from tilefuse.codegen.cpu import build_kernel
from tilefuse.codegen.toolchain import entry_ok
from tilefuse.ir.prims import ScalarFn
art = build_kernel(_unary("k0_erf", ScalarFn.ERF), cache_dir=Path(sys.argv[1]))
assert entry_ok(art.path)
print(art.path)
"""


def test_processes_racing_to_build_one_kernel_agree_on_one_sound_entry(tmp_path):
    cache = tmp_path / "kernels"
    builds = [subprocess.Popen([sys.executable, "-c", RACE, str(cache)], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [b.communicate(timeout=300) for b in builds]
    assert all(b.returncode == 0 for b in builds), [err[-1000:] for _, err in outs]
    assert len({out.strip() for out, _ in outs}) == 1
    (lib,) = cache.glob("*.so")
    assert entry_ok(lib) and not list(cache.glob(".*"))
