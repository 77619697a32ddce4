"""The compiler driver: the kernel cache (counted compiler runs, not timings), parallel
builds into one cache, and compile errors that name the kernel, its source and the
compiler's message."""
from __future__ import annotations

import shutil
import threading

import numpy as np
import pytest

from tests.codegen.cpu_programs import elementwise, load, param, program
from tilefuse.codegen.cpu import build_all, build_kernel, emit_program
from tilefuse.codegen.cpu.call import call_kernel
from tilefuse.errors import CompileError
from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ScalarFn
from tilefuse.tile_ir.ir import Call

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
F32 = DType.FLOAT32


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
