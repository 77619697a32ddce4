"""The host's depthwise taps over channel planes read where they lie (``PlaneTaps``:
tile_ir/ir.py, codegen/cpu/prelude.py ``PLANE_TAPS_PRELUDE``): the C helper against the tile
interpreter on fresh random inputs, over kernels the helper unrolls (3 x 3, 5 x 5 at strides 1
and 2) and ones it does not (1 x 1, 7 x 7, 3 x 5, dilated, stride 3), pads of every side, rows
of 1 to 129 positions around its blocks of 16 and 64, blocks of rows that start inside the
plane, channels and images past the first, unit strides both read in place (AVX-512 and
AVX2: the native build and x86-64-v3) and through the ring (x86-64-v2); and the verifier's
refusals."""
from __future__ import annotations

import numpy as np
import pytest

from tests.codegen.cpu_programs import assert_same, param, program, run_both
from tilefuse.codegen.cpu import build_all
from tilefuse.codegen.options import CpuOptions
from tilefuse.cpu_isa import host_level
from tilefuse.errors import GraphError
from tilefuse.ir.dtypes import DType
from tilefuse.target import CPU, CUDA_SM90A
from tilefuse.tile_ir.ir import PlaneTaps, const_index
from tilefuse.tile_ir.verify import verify_program

F32 = DType.FLOAT32

# (input h, w), kernel, strides, dilations, pads (top, left), output width, block of rows (row0, rows)
CASES = {
    "3x3_s1_wide": ((9, 112), (3, 3), (1, 1), (1, 1), (1, 1), 112, (0, 9)),
    "3x3_s1_block_inside": ((20, 56), (3, 3), (1, 1), (1, 1), (1, 1), 56, (7, 6)),
    "3x3_s2": ((13, 37), (3, 3), (2, 2), (1, 1), (1, 1), 19, (0, 7)),
    "3x3_s2_no_pad": ((12, 34), (3, 3), (2, 2), (1, 1), (0, 0), 16, (2, 3)),
    "5x5_s1": ((11, 65), (5, 5), (1, 1), (1, 1), (2, 2), 65, (0, 11)),
    "5x5_s2": ((15, 33), (5, 5), (2, 2), (1, 1), (2, 2), 17, (3, 5)),
    "1x1": ((4, 17), (1, 1), (1, 1), (1, 1), (0, 0), 17, (0, 4)),
    "7x7_wide_rows": ((9, 100), (7, 7), (1, 1), (1, 1), (3, 3), 100, (0, 9)),
    "3x5_asymmetric": ((8, 30), (3, 5), (1, 1), (1, 1), (0, 1), 28, (0, 6)),
    "dilated": ((14, 40), (3, 3), (1, 1), (2, 3), (2, 3), 40, (1, 12)),
    "stride_3": ((16, 50), (3, 3), (3, 3), (1, 1), (1, 1), 17, (0, 6)),
    "one_position": ((3, 1), (3, 3), (1, 1), (1, 1), (1, 1), 1, (0, 3)),
    # unit strides on AVX-512 read the rows where they lie, lanes past their ends masked:
    # widths around the blocks of 16 and 64, no left pad, a pad past the kernel's reach
    "3x3_s1_width_17": ((6, 17), (3, 3), (1, 1), (1, 1), (1, 1), 17, (0, 6)),
    "3x3_s1_width_64": ((5, 64), (3, 3), (1, 1), (1, 1), (1, 1), 64, (1, 3)),
    "3x3_s1_width_129": ((4, 129), (3, 3), (1, 1), (1, 1), (1, 1), 129, (0, 4)),
    "5x5_s1_right_pad_only": ((9, 40), (5, 5), (1, 1), (1, 1), (0, 0), 38, (0, 5)),
    "3x3_s1_wide_pads": ((7, 30), (3, 3), (1, 1), (1, 1), (2, 2), 32, (0, 9)),
    "5x5_s1_narrow": ((7, 7), (5, 5), (1, 1), (1, 1), (2, 2), 7, (0, 7)),
}


def _taps_program(name, hw, kernel, strides, dilations, pads, width, block, chans=3, image=1, channel0=2):
    (h, w), (kh, kw) = hw, kernel
    row0, rows = block
    x = param("x", F32, (2, channel0 + chans + 1, h, w))
    wt = param("w", F32, (chans, kh * kw))
    out = param("out", F32, (chans, rows * width + 5))  # past the sums: never written
    body = [PlaneTaps(x, const_index(image), const_index(channel0), wt, out, const_index(row0), rows, width, kernel,
                      strides, dilations, pads)]
    return program(f"plane_taps_{name}", [x, wt], [out], body)


UNIT_STRIDES = [n for n, c in CASES.items() if c[2] == (1, 1) and c[3] == (1, 1)]


@pytest.mark.parametrize("name, isa", [(n, level) for n in CASES for level in ("native", "x86-64-v3", "x86-64-v2")])
def test_plane_taps_match_the_interpreter(name, isa):
    """(x86-64-v3: AVX2's masked lanes and 8-lane sums; x86-64-v2: the ring of padded rows
    for unit strides too and generic vectors, as hosts without AVX2 take them)"""
    if isa != "native" and host_level() not in ("x86-64-v2", "x86-64-v3", "x86-64-v4"):
        pytest.skip(f"this machine does not run {isa} code")
    p = _taps_program(name, *CASES[name])
    assert verify_program(p, CPU) is None
    (artifact,) = build_all([p], options=CpuOptions(isa=isa))
    rng = np.random.default_rng()
    x, w = p.params[0], p.params[1]
    got, want = run_both(p, artifact, [rng.standard_normal(x.shape).astype(np.float32),
                                       rng.standard_normal(w.shape).astype(np.float32)])
    assert_same(p, got, want, rtol={"out": 1e-5})  # (fused multiply-adds round once)
    rows, width = CASES[name][6][1], CASES[name][5]
    assert not got[0][:, rows * width:].any()  # past the sums: not written


def test_the_interpreter_pads_with_zeros():
    """A 3 x 3 sum of ones over a plane of ones counts the taps inside it: 4 at a corner,
    6 on an edge, 9 inside (so the interpreter, which the C is held to, pads as ONNX does)."""
    p = _taps_program("ones", (4, 5), (3, 3), (1, 1), (1, 1), (1, 1), 5, (0, 4), chans=1, image=0, channel0=0)
    (artifact,) = build_all([p])
    got, want = run_both(p, artifact, [np.ones((2, 2, 4, 5), np.float32), np.ones((1, 9), np.float32)])
    counts = np.array([[4, 6, 6, 6, 4], [6, 9, 9, 9, 6], [6, 9, 9, 9, 6], [4, 6, 6, 6, 4]], np.float32)
    np.testing.assert_array_equal(want[0][0, :20].reshape(4, 5), counts)
    np.testing.assert_array_equal(got[0][0, :20].reshape(4, 5), counts)


def test_the_verifier_refuses_what_the_helper_cannot_take():
    good = _taps_program("good", (6, 8), (3, 3), (1, 1), (1, 1), (1, 1), 8, (0, 6))
    with pytest.raises(GraphError, match="host's"):
        verify_program(good, CUDA_SM90A)
    x, w, out = good.params
    for bad in (PlaneTaps(x, const_index(0), const_index(0), w, out, const_index(0), 7, 8, (3, 3), (1, 1), (1, 1), (1, 1)),
                PlaneTaps(x, const_index(0), const_index(0), w, out, const_index(0), 6, 8, (3, 2), (1, 1), (1, 1), (1, 1)),
                PlaneTaps(x, const_index(0), const_index(0), w, out, const_index(0), 6, 8, (3, 3), (1, 1), (1, 1), (3, 1))):
        with pytest.raises(GraphError, match="do not fit"):
            verify_program(program("bad", [x, w], [out], [bad]), CPU)
    halves = param("xh", DType.FLOAT16, x.shape)
    with pytest.raises(GraphError, match="float32"):
        verify_program(program("half", [halves, w], [out], [PlaneTaps(halves, const_index(0), const_index(0), w, out,
                                                                    const_index(0), 6, 8, (3, 3), (1, 1), (1, 1), (1, 1))]),
                       CPU)
