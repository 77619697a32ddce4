"""Element loops with an overlapped last step (codegen/cpu/emit.py, ``CpuOptions.overlap_tail``):
a loop of stores computing a costly element function (a sigmoid, an exp, a division) over
more elements than a step but with a tail the compiler would finish in scalar code runs in
whole steps, the last moved back to end at the loop's end. The C kernel matches the tile
interpreter on fresh random inputs at every length around a step; loops that read what
they write, cheap loops and tails of whole quarter-vectors keep their plain form."""
from __future__ import annotations

import numpy as np
import pytest

from tests.codegen.cpu_programs import assert_same, load, param, parallel, program, run_both
from tilefuse.codegen.cpu import build_all
from tilefuse.codegen.cpu.emit import emit_program
from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ScalarFn
from tilefuse.tile_ir.ir import Call, Store


def _program(n: int, fn: ScalarFn | None, in_place: bool = False):
    """out[r, i] = fn(x[r, i]) * 2 (or x * 2 without fn) over 3 rows of ``n``; ``in_place``:
    the loop updates out from itself."""
    x, out = param("x", DType.FLOAT32, (3, n)), param("out", DType.FLOAT32, (3, n))

    def body(i):
        v = load(out if in_place else x, i)
        if fn is not None:
            v = Call(fn, (v,), DType.FLOAT32)
        return [Store(out, i, Call(ScalarFn.MUL, (v, load(x, i)) if in_place else (v, v), DType.FLOAT32))]

    return program(f"tails_{n}", [x], [out], [parallel((3, n), body)])


def _overlapped(p) -> bool:
    return "_o += 16)" in emit_program(p).text


@pytest.mark.parametrize("n", [17, 33, 49, 50, 51, 63, 65, 97])
@pytest.mark.parametrize("fn", [ScalarFn.SIGMOID, ScalarFn.EXP, ScalarFn.TANH])
def test_costly_loops_with_scalar_tails_overlap_their_last_step(n, fn):
    p = _program(n, fn)
    assert _overlapped(p), emit_program(p).text
    (artifact,) = build_all([p])
    x = np.random.default_rng().standard_normal((3, n)).astype(np.float32) * 3
    got, want = run_both(p, artifact, [x])
    assert_same(p, got, want, rtol={"out": 2e-6})


@pytest.mark.parametrize("n, fn, in_place", [
    (16, ScalarFn.SIGMOID, False),   # whole steps: nothing to overlap
    (48, ScalarFn.SIGMOID, False),
    (12, ScalarFn.SIGMOID, False),   # under one step
    (52, ScalarFn.SIGMOID, False),   # a tail of 4: the compiler's quarter-vector finishes it
    (56, ScalarFn.SIGMOID, False),   # and of 8
    (49, None, False),               # cheap arithmetic: the compiler's own tail
    (49, ScalarFn.SIGMOID, True),    # reads what it writes: an iteration run twice would differ
])
def test_other_loops_keep_their_plain_form(n, fn, in_place):
    p = _program(n, fn, in_place)
    assert not _overlapped(p), emit_program(p).text
    (artifact,) = build_all([p])
    x = np.random.default_rng().standard_normal((3, n)).astype(np.float32)
    got, want = run_both(p, artifact, [x])
    assert_same(p, got, want, rtol={"out": 2e-6})
