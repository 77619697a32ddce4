"""The host's block transpose and depthwise lane taps (``Transpose``, ``LaneTaps``: tile_ir/ir.py,
codegen/cpu/prelude.py ``TRANSPOSE_PRELUDE``): C kernels against the tile interpreter on fresh
random inputs, over block sizes around the 16 x 16 blocks' edges, regions at offsets inside
larger buffers, rows of whole planes (a 1 x 1 convolution's input turned), and tap rows of
every length around the helper's blocks of 8 positions; and the verifier's refusals of what
the helpers cannot take. Each helper is built for the host's instruction set and for the
portable levels below it the host runs (AVX-512's 16 x 16 blocks, AVX2's 8 x 8 blocks and
two 8-lane halves of the taps, plain C)."""
from __future__ import annotations

import numpy as np
import pytest

from tests.codegen.cpu_programs import assert_same, elementwise, load, param, program, run_both
from tests.codegen.prelude_builds import host_levels
from tilefuse.codegen.cpu import build_all, emit_program
from tilefuse.codegen.options import CpuOptions
from tilefuse.errors import GraphError
from tilefuse.ir.dtypes import DType
from tilefuse.target import CPU, CUDA_SM90A
from tilefuse.tile_ir.ir import Buffer, LaneTaps, Region, Scope, Transpose, const_index
from tilefuse.tile_ir.verify import verify_program

F32 = DType.FLOAT32


def _turn_program(rows: int, cols: int):
    """out[1 + i, 3 + j] = x[2, 1 + i, 3, j]: a block of a 4-D input turned into a local
    tile (at an offset) and turned back into a 2-D output (at another)."""
    x = param("x", F32, (3, rows + 2, 5, cols))
    out = param("out", F32, (rows + 1, cols + 3))
    t = Buffer("t_tile", F32, (cols + 4, rows), Scope.FRAGMENT)
    body = [Transpose(Region(x, (const_index(2), const_index(1), const_index(3), const_index(0)), (1, rows, 1, cols)),
                      Region(t, (const_index(4), const_index(0)), (cols, rows))),
            Transpose(Region(t, (const_index(4), const_index(0)), (cols, rows)),
                      Region(out, (const_index(1), const_index(3)), (rows, cols)))]
    return program(f"turn_{rows}_{cols}", [x], [out], body, allocs=[t])


@pytest.mark.parametrize("isa", host_levels())
@pytest.mark.parametrize("rows, cols", [(1, 1), (7, 16), (16, 7), (16, 16), (17, 33), (49, 16), (16, 196), (5, 40)])
def test_block_transposes_match_the_interpreter(rows, cols, isa):
    p = _turn_program(rows, cols)
    (artifact,) = build_all([p], options=CpuOptions(isa=isa))
    x = np.random.default_rng().standard_normal((3, rows + 2, 5, cols)).astype(np.float32)
    got, want = run_both(p, artifact, [x])
    assert_same(p, got, want)
    np.testing.assert_array_equal(got[0][1:, 3:], x[2, 1:rows + 1, 3, :])
    assert verify_program(p, CPU) is None


def _taps_program(rows: int, width: int, kh: int, kw: int, stride: int):
    wp = (width - 1) * stride + kw
    rows_in = (rows - 1) * stride + kh
    x, w = param("x", F32, (rows_in * wp, 16)), param("w", F32, (kh * kw, 16))
    out = param("out", F32, (rows * width + 3, 16))
    offsets = tuple(ty * wp + tx for ty in range(kh) for tx in range(kw))
    body = [LaneTaps(x, w, out, rows, width, stride * wp, stride, offsets)]
    return program(f"taps_{rows}_{width}_{kh}{kw}_{stride}", [x, w], [out], body), (rows_in * wp, kh * kw)


@pytest.mark.parametrize("rows, width, kh, kw, stride", [
    (1, 1, 1, 1, 1), (3, 7, 3, 3, 1), (2, 8, 5, 5, 1), (2, 9, 5, 5, 1), (4, 15, 3, 3, 2), (1, 17, 7, 7, 1), (5, 14, 5, 3, 2)])
@pytest.mark.parametrize("isa", host_levels())
def test_lane_taps_match_the_interpreter(rows, width, kh, kw, stride, isa):
    p, (positions, taps) = _taps_program(rows, width, kh, kw, stride)
    (artifact,) = build_all([p], options=CpuOptions(isa=isa))
    rng = np.random.default_rng()
    got, want = run_both(p, artifact, [rng.standard_normal((positions, 16)).astype(np.float32),
                                       rng.standard_normal((taps, 16)).astype(np.float32)])
    assert_same(p, got, want, rtol={"out": 1e-5})  # (fused multiply-adds round once)
    assert not got[0][rows * width:].any()  # rows past the sums are not written


@pytest.mark.parametrize("extra", [0, 5])
def test_a_tile_the_taps_fill_is_not_zeroed_first(extra):
    """Lane taps overwrite their sums (no accumulation into the tile): a local tile they
    fill whole is declared without ``= {0}`` (its zeroing was 3% of a 5 x 5 depthwise
    layer over 14 x 14); one with rows they leave (``extra``) keeps it, and reads them."""
    rows, width = 3, 7
    x, w = param("x", F32, ((rows + 2) * (width + 2), 16)), param("w", F32, (9, 16))
    out = param("out", F32, (rows * width + extra, 16))
    sums = Buffer("dw_sums", F32, (rows * width + extra, 16), Scope.FRAGMENT)
    offsets = tuple(ty * (width + 2) + tx for ty in range(3) for tx in range(3))
    body = [LaneTaps(x, w, sums, rows, width, width + 2, 1, offsets),
            elementwise(out, lambda i: load(sums, i))]
    prog = program(f"filled_{extra}", [x, w], [out], body, allocs=[sums])
    text = emit_program(prog).text
    assert ("float dw_sums[" in text) and (("= {0};" in text.split("float dw_sums[")[1].split("\n")[0]) == bool(extra))
    (artifact,) = build_all([prog])
    rng = np.random.default_rng()
    got, want = run_both(prog, artifact, [rng.standard_normal(x.shape).astype(np.float32),
                                          rng.standard_normal(w.shape).astype(np.float32)])
    assert_same(prog, got, want, rtol={"out": 1e-5})
    assert not got[0][rows * width:].any()  # the rows the taps leave read as zeros


def test_the_verifier_refuses_what_the_helpers_cannot_take():
    x, out = param("x", F32, (4, 6)), param("out", F32, (6, 4))
    origin = (const_index(0), const_index(0))
    bad_turn = Transpose(Region(x, origin, (4, 6)), Region(out, origin, (4, 6)))
    with pytest.raises(GraphError, match="does not fit"):
        verify_program(program("bad_turn", [x], [out], [bad_turn]), CPU)
    good = Transpose(Region(x, (const_index(0), const_index(0)), (4, 6)), Region(out, (const_index(0), const_index(0)), (6, 4)))
    with pytest.raises(GraphError, match="host's"):
        verify_program(program("turn_on_gpu", [x], [out], [good]), CUDA_SM90A)
    xs, ws, outs = param("xs", F32, (20, 16)), param("ws", F32, (9, 16)), param("outs", F32, (9, 16))
    too_far = LaneTaps(xs, ws, outs, 3, 3, 5, 1, tuple(range(9)))  # reads position 2 * 5 + 2 + 8 = 20
    with pytest.raises(GraphError, match="do not fit"):
        verify_program(program("bad_taps", [xs, ws], [outs], [too_far]), CPU)


@pytest.mark.parametrize("chans, h, w", [(24, 7, 7), (16, 5, 9), (33, 3, 1)])
def test_block_transposes_of_whole_planes_match_the_interpreter(chans, h, w):
    """Rows of whole H x W planes ([1, C, H, W] -> C rows of H * W, a 1 x 1 convolution's
    im2col tile): turned into a tile at an offset, as the interpreter turns them."""
    x = param("x", F32, (2, chans + 7, h, w))
    out = param("out", F32, (h * w + 2, chans))
    origin = (const_index(1), const_index(5), const_index(0), const_index(0))
    body = [Transpose(Region(x, origin, (1, chans, h, w)), Region(out, (const_index(2), const_index(0)), (h * w, chans)))]
    p = program(f"planes_{chans}_{h}_{w}", [x], [out], body)
    assert verify_program(p, CPU) is None
    (artifact,) = build_all([p])
    xs = np.random.default_rng().standard_normal(x.shape).astype(np.float32)
    got, want = run_both(p, artifact, [xs])
    assert_same(p, got, want)
    np.testing.assert_array_equal(got[0][2:], xs[1, 5:5 + chans].reshape(chans, h * w).T)


def test_the_verifier_refuses_rows_that_are_not_runs():
    x, out = param("x", F32, (1, 8, 7, 7)), param("out", F32, (21, 8))
    zero = const_index(0)
    part_planes = Transpose(Region(x, (zero, zero, zero, zero), (1, 8, 3, 7)), Region(out, (zero, zero), (21, 8)))
    assert verify_program(program("runs", [x], [out], [part_planes]), CPU) is None  # 3 whole rows of each plane: runs
    o2 = param("o2", F32, (18, 8))
    gaps = Transpose(Region(x, (zero, zero, zero, zero), (1, 8, 3, 6)), Region(o2, (zero, zero), (18, 8)))
    with pytest.raises(GraphError, match="rows of runs"):  # rows of 3 x 6 of 7-wide rows: not one run
        verify_program(program("gaps", [x], [o2], [gaps]), CPU)
