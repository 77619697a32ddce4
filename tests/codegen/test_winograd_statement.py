"""The host's 3 x 3 convolution by minimal filtering (``Winograd``: tile_ir/ir.py,
codegen/cpu/prelude.py ``WINOGRAD_PRELUDE``): the interpreter against a direct convolution,
and C kernels against the interpreter, on fresh random inputs over blocks whose rows and
columns are not whole 4 x 4 tiles, blocks that start above the map or end below it, padding
wider than the filter's reach, several chunks of input channels and a block of output
channels past the first; and the verifier's refusals of what the helper cannot take."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.codegen.cpu_programs import assert_same, elementwise, load, param, program, run_both
from tilefuse.codegen.cpu import build_all
from tilefuse.errors import GraphError
from tilefuse.ir.dtypes import DType
from tilefuse.target import CPU, CUDA_SM90A
from tilefuse.tile_ir.interpret import run_program
from tilefuse.tile_ir.ir import Buffer, Scope, Var, Winograd, const_index
from tilefuse.tile_ir.lower.conv_winograd import WinogradTile, weight
from tilefuse.tile_ir.verify import verify_program

F32 = DType.FLOAT32


def _program(x_shape, cout, n, kc, rows, width, row0, col0, k0):
    tiles = -(-rows // 4) * -(-width // 4)
    x = param("x", F32, x_shape)
    u = param("u", F32, (cout // n, x_shape[1] // kc, 36, n, kc))
    out = param("out", F32, (n, rows * width))
    v = Buffer("wino_v", F32, (36, kc, tiles), Scope.FRAGMENT)
    m = Buffer("wino_m", F32, (36, n, tiles), Scope.FRAGMENT)
    c = Buffer("c_tile", F32, (n, rows * width), Scope.FRAGMENT)
    body = [Winograd(x, Var("bx"), const_index(row0), col0, u, const_index(k0), v, m, c, rows, width),
            elementwise(out, lambda idx: load(c, idx))]
    return program(f"wino_{rows}x{width}_{row0}_{col0}_{k0}", [x, u], [out], body, allocs=[v, m, c], grid=(x_shape[0],)), \
        WinogradTile(rows, n, kc, tiles)


def _direct(x, g, image, row0, col0, k0, n, rows, width):
    """The convolution the statement states, summed directly in float64."""
    chans, h, w = x.shape[1:]
    grid = np.zeros((chans, rows + 2, width + 2))
    for r in range(rows + 2):
        for q in range(width + 2):
            y, xx = row0 + r, col0 + q
            if 0 <= y < h and 0 <= xx < w:
                grid[:, r, q] = x[image, :, y, xx]
    out = np.zeros((n, rows, width))
    for a in range(3):
        for b in range(3):
            out += np.einsum("kc,crq->krq", g[k0:k0 + n, :, a, b], grid[:, a:a + rows, b:b + width])
    return out.reshape(n, rows * width)


CASES = [  # (x shape, Cout, channels a block, k_chunk, rows, width, row0, col0, k0)
    ((1, 16, 14, 14), 32, 16, 16, 14, 14, -1, -1, 16),  # the second block of output channels
    ((2, 24, 13, 17), 24, 24, 8, 6, 17, 3, -1, 0),  # rows 4..9 of 13, three chunks, the last image
    ((1, 16, 12, 30), 48, 16, 16, 14, 32, -2, -2, 32),  # padding 2: the block reaches past the map
    ((1, 32, 5, 6), 16, 16, 32, 3, 4, 4, 0, 0),  # starts at the map's last row
    ((1, 16, 9, 11), 16, 16, 16, 9, 11, -1, -1, 0),  # neither side whole tiles
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[4]}x{c[5]}")
def test_winograd_matches_a_direct_convolution_and_the_interpreter(case):
    x_shape, cout, n, kc, rows, width, row0, col0, k0 = case
    p, t = _program(*case)
    assert verify_program(p, CPU) is None
    rng = np.random.default_rng()
    x = rng.standard_normal(x_shape).astype(np.float32)
    g = (rng.standard_normal((cout, x_shape[1], 3, 3)) / np.sqrt(9 * x_shape[1])).astype(np.float32)
    u = weight(g, t)
    (artifact,) = build_all([p])
    got, want = run_both(p, artifact, [x, u])
    assert_same(p, got, want, rtol={"out": 2e-5})  # (the sums in another order)
    # the grid's last image: what the interpreter left in ``out``
    direct = _direct(x.astype(np.float64), g.astype(np.float64), x_shape[0] - 1, row0, col0, k0, n, rows, width)
    scale = np.abs(direct).max()
    assert np.abs(want[0] - direct).max() <= 1e-5 * scale
    assert np.abs(got[0] - direct).max() <= 1e-5 * scale


def test_the_interpreter_states_the_first_image_too():
    """The first image's block (the case's grid of two run as one tile): the statement
    reads the image its expression names."""
    case = CASES[1]
    p, t = _program(*case)
    x_shape, cout = case[0], case[1]
    rng = np.random.default_rng()
    x = rng.standard_normal(x_shape).astype(np.float32)
    g = rng.standard_normal((cout, x_shape[1], 3, 3)).astype(np.float32)
    p1 = dataclasses.replace(p, grid=(1,))
    out = np.zeros((case[2], case[4] * case[5]), np.float32)
    run_program(p1, [x, weight(g, t), out])
    direct = _direct(x.astype(np.float64), g.astype(np.float64), 0, *case[6:8], case[8], case[2], case[4], case[5])
    assert np.abs(out - direct).max() <= 1e-5 * np.abs(direct).max()


def test_the_verifier_refuses_what_the_helper_cannot_take():
    p, _ = _program(*CASES[0])
    with pytest.raises(GraphError, match="host's"):
        verify_program(p, CUDA_SM90A)
    x = param("x", F32, (1, 16, 14, 14))
    u = param("u", F32, (2, 1, 36, 16, 16))
    v = Buffer("wino_v", F32, (36, 16, 16), Scope.FRAGMENT)
    m = Buffer("wino_m", F32, (36, 16, 16), Scope.FRAGMENT)
    c = Buffer("c_tile", F32, (16, 196), Scope.FRAGMENT)
    out = param("out", F32, (16, 196))
    copy = elementwise(out, lambda idx: load(c, idx))
    refused = [
        Winograd(x, Var("bx"), const_index(-1), -1, u, const_index(8), v, m, c, 14, 14),  # k0 inside a block
        Winograd(x, Var("bx"), const_index(-1), -1, u, const_index(32), v, m, c, 14, 14),  # k0 past the blocks
        Winograd(x, Var("bx"), const_index(-1), -1, u, const_index(0), v, m, c, 15, 14),  # rows past c
        Winograd(x, Var("bx"), const_index(-1), -1, param("u", F32, (2, 1, 36, 16, 8)), const_index(0), v, m, c, 14, 14),
    ]  # (the last: a chunk unlike v's)
    for bad in refused:
        with pytest.raises(GraphError, match="does not fit"):
            verify_program(program("bad", [x, bad.u], [out], [bad, copy], allocs=[v, m, c]), CPU)
