"""An element loop whose index clamps its last iterations to the last real element
(``min(i + a, c)``: a tile's last lanes past a 197-key sequence reading key 196 again) is
printed as two loops cut where the clamp starts (codegen/cpu/emit.py, ``_clamp_cut``): the
first without the clamp (runs GCC vectorises), the rest as before. Offsets from outer
loops of one value (a K loop of one step) count; ones that vary, or cuts outside the loop,
leave it whole. C matches the tile interpreter on fresh random inputs."""
from __future__ import annotations

import re

import numpy as np
import pytest

from tests.codegen.cpu_programs import assert_same, load, param, program, run_both
from tilefuse.codegen.cpu import build_all
from tilefuse.codegen.cpu.emit import emit_program
from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ScalarFn
from tilefuse.tile_ir.ir import Call, IOp, Loop, LoopKind, Store, Var, iop

F32 = DType.FLOAT32


def _clamped_copy(n: int, width: int, outer: int, offset_step: int, name: str):
    """out[k, r, i] = x[min(i + k * offset_step, n - 1)] * (r + 1) for i < width, under an
    outer serial loop k of ``outer`` steps and a parallel row loop r."""
    x = param("x", F32, (n,))
    out = param("out", F32, (outer, 3, width))
    k, r, i = Var("k"), Var("r"), Var("i")
    at = iop(IOp.MIN, iop(IOp.ADD, i, iop(IOp.MUL, k, offset_step)), n - 1)
    value = Call(ScalarFn.MUL, (load(x, (at,)), Call(ScalarFn.CAST, (iop(IOp.ADD, r, 1),), F32)), F32)
    inner = Loop(i, width, LoopKind.PARALLEL, (Store(out, (k, r, i), value),))
    body = Loop(k, outer, LoopKind.SERIAL, (Loop(r, 3, LoopKind.PARALLEL, (inner,)),))
    return program(name, [x], [out], [body])


CASES = {
    # name: (n, width, outer steps, offset a step, cut expected)
    "keys_197_of_208": (197, 208, 1, 208, True),
    "no_clamp_needed": (300, 208, 1, 208, False),
    "offset_varies": (197, 208, 2, 208, False),
    "whole_loop_clamped": (5, 40, 1, 0, True),
}


@pytest.fixture(scope="module")
def artifacts():
    progs = {name: _clamped_copy(*spec[:4], name=name) for name, spec in CASES.items()}
    return progs, dict(zip(progs, build_all(list(progs.values()))))


@pytest.mark.parametrize("name", list(CASES))
def test_a_clamped_tail_is_cut_off_its_loop(name, artifacts):
    progs, built = artifacts
    n, width, outer, step, cut = CASES[name]
    text = emit_program(progs[name]).text
    body = text[text.index("(void **args)\n{"):]
    loops = re.findall(r"for \(int64_t i\w* = (\d+); i\w* < (\d+);", body)
    clamped = [line for line in body.splitlines() if "tf_min_i64" in line]
    if cut:
        assert loops == [("0", str(n)), (str(n), str(width))], body
        assert len(clamped) == 1, body  # the first loop reads x[i] plain
    else:
        assert loops == [("0", str(width))], body
    got, want = run_both(progs[name], built[name], [np.random.default_rng().standard_normal(n).astype(np.float32)])
    assert_same(progs[name], got, want)
