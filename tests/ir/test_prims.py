"""Primitive shape rules and numpy references on cases with known answers."""
import numpy as np
import pytest

from tilefuse.ir import DType, TensorType
from tilefuse.ir.prims import (
    Conv, ConvTranspose, Gather, Map, MatMul, Pad, PadMode, Reduce, ReduceFn,
    ScalarFn, Slice, WindowReduce,
)

rng = np.random.default_rng()


def t(dtype, *shape):
    return TensorType(dtype, shape)


def test_half_matmul_accumulates_in_float32():
    a = rng.standard_normal((4, 256)).astype(np.float16)
    b = rng.standard_normal((256, 3)).astype(np.float16)
    (y,) = MatMul().evaluate([a, b])
    assert y.dtype == np.float16
    want = (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(y, want)


def test_conv_matches_direct_loop():
    x = rng.standard_normal((1, 4, 7, 6)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 2)).astype(np.float32)
    op = Conv(strides=(2, 1), dilations=(1, 2), pads=(1, 0, 1, 1), groups=2)
    (y,) = op.evaluate([x, w])
    assert op.infer([t(DType.FLOAT32, *x.shape), t(DType.FLOAT32, *w.shape)])[0].shape == y.shape
    xp = np.pad(x, [(0, 0), (0, 0), (1, 1), (0, 1)])
    want = np.zeros_like(y)
    for m in range(6):
        g = m // 3
        for i in range(y.shape[2]):
            for j in range(y.shape[3]):
                patch = xp[0, 2 * g : 2 * g + 2, 2 * i : 2 * i + 3, j : j + 3 : 2]
                want[0, m, i, j] = np.sum(patch * w[m])
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_conv_transpose_is_the_adjoint_of_conv():
    # <conv(x), y> == <x, conv_transpose(y)> for the same weights and no padding.
    x = rng.standard_normal((1, 3, 5, 5))
    w = rng.standard_normal((4, 3, 3, 3))
    (cx,) = Conv((2, 2), (1, 1), (0, 0, 0, 0)).evaluate([x, w])
    y = rng.standard_normal(cx.shape)
    (ty,) = ConvTranspose((2, 2), (1, 1), (0, 0, 0, 0), (0, 0)).evaluate([y, w])
    assert ty.shape == x.shape
    np.testing.assert_allclose(np.sum(cx * y), np.sum(x * ty), rtol=1e-10)


def test_window_max_with_padding():
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    (y,) = WindowReduce(ReduceFn.MAX, (2, 2), (2, 2), (1, 1), (1, 1, 1, 1)).evaluate([x])
    np.testing.assert_array_equal(y[0, 0], [[0, 2, 3], [8, 10, 11], [12, 14, 15]])


def test_reduce_over_empty_axis_gives_identity():
    x = np.zeros((2, 0), np.float32)
    (s,) = Reduce(ReduceFn.SUM, (1,), False).evaluate([x])
    (m,) = Reduce(ReduceFn.MAX, (1,), False).evaluate([x])
    np.testing.assert_array_equal(s, [0, 0])
    assert np.all(np.isneginf(m))


def test_slice_negative_step_and_empty():
    x = np.arange(10)
    (y,) = Slice((8,), (-3,), (3,)).evaluate([x])
    assert y.tolist() == [8, 5, 2]
    (e,) = Slice((0,), (1,), (0,)).evaluate([x])
    assert e.shape == (0,)
    with pytest.raises(ValueError, match="out of bounds"):
        Slice((8,), (1,), (3,)).infer([t(DType.INT64, 10)])


def test_gather_wraps_negative_and_rejects_out_of_range():
    x = np.arange(5) * 10
    (y,) = Gather(0).evaluate([x, np.array([-1, 0])])
    assert y.tolist() == [40, 0]
    with pytest.raises(IndexError):
        Gather(0).evaluate([x, np.array([5])])


def test_integer_division_truncates_like_onnxruntime():
    (y,) = Map(ScalarFn.DIV).evaluate([np.array([-7, 7], np.int32), np.array([2, -2], np.int32)])
    assert y.tolist() == [-3, -3]


def test_cast_float_to_int_truncates_and_bool_is_nonzero():
    (y,) = Map(ScalarFn.CAST, DType.INT32).evaluate([np.array([-1.7, 2.9], np.float32)])
    assert y.tolist() == [-1, 2]
    (z,) = Map(ScalarFn.CAST, DType.BOOL).evaluate([np.array([0.0, 0.1], np.float32)])
    assert z.tolist() == [False, True]


def test_pad_reflect():
    (y,) = Pad((2, 1), PadMode.REFLECT).evaluate([np.array([1, 2, 3])])
    assert y.tolist() == [3, 2, 1, 2, 3, 2]


def test_map_rules():
    assert Map(ScalarFn.LT).infer([t(DType.FLOAT16, 2, 1), t(DType.FLOAT16, 3)])[0] == t(DType.BOOL, 2, 3)
    with pytest.raises(TypeError, match="float input"):
        Map(ScalarFn.EXP).infer([t(DType.INT32, 2)])
    with pytest.raises(TypeError, match="condition must be bool"):
        Map(ScalarFn.WHERE).infer([t(DType.INT32, 2), t(DType.FLOAT32, 2), t(DType.FLOAT32, 2)])
