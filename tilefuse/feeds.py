"""Checking user-supplied inputs against what a model or plan expects."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from tilefuse.errors import InputError
from tilefuse.ir.dtypes import DType
from tilefuse.ir.types import TensorType


def check_feeds(expected: Sequence[tuple[str, TensorType]], feeds: Mapping[str, object],
                allow_device: bool = False) -> dict[str, np.ndarray]:
    """Return the feeds as numpy arrays, or raise InputError naming what is wrong.

    Every expected input must be given with exactly its dtype and shape; unknown names
    are an error too (a typo would otherwise be silently ignored). With ``allow_device``,
    a GPU tensor (``__cuda_array_interface__``) is checked the same way and returned as a
    DeviceView, which the CUDA runtime copies device to device.
    """
    names = [n for n, _ in expected]
    unknown = sorted(set(feeds) - set(names))
    if unknown:
        raise InputError(f"unknown input name(s) {unknown}; the model's inputs are {names}")
    missing = [n for n in names if n not in feeds]
    if missing:
        raise InputError(f"missing input(s) {missing}; the model's inputs are {names}")
    out: dict[str, np.ndarray] = {}
    for name, t in expected:
        device = _device_feed(name, feeds[name], t, allow_device)
        if device is not None:
            out[name] = device  # type: ignore[assignment]
            continue
        array = np.asarray(feeds[name])
        _check_type(name, array.dtype, tuple(array.shape), t)
        out[name] = array
    return out


def _check_type(name: str, dtype: np.dtype, shape: tuple[int, ...], t: TensorType, where: str = "") -> None:
    """InputError unless ``dtype`` and ``shape`` are exactly ``t``'s; ``where`` says where the
    tensor lives when that is not the host."""
    try:
        got = DType.from_numpy(dtype)
    except TypeError:
        raise InputError(f"input {name!r}: expected {t.dtype}, got {'device' if where else 'numpy'} dtype {dtype}") from None
    on = f" ({where})" if where else ""
    if got is not t.dtype:
        raise InputError(f"input {name!r}: expected dtype {t.dtype}, got {got}{on}")
    if shape != t.shape:
        raise InputError(f"input {name!r}: expected shape {list(t.shape)}, got {list(shape)}{on}")


@dataclass(frozen=True)
class DeviceView:
    """A borrowed, C-contiguous device tensor: where it is, its dtype and shape."""

    ptr: int
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def device_view(obj: object) -> DeviceView | None:
    """The device tensor behind ``obj``, or None if it is not one. Raises ValueError for
    a device tensor the runtime cannot read as it is (strided, or a dtype numpy lacks)."""
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is None:
        return None
    shape = tuple(int(d) for d in cai["shape"])
    dtype = np.dtype(cai["typestr"])
    strides = cai.get("strides")
    if strides is not None and tuple(strides) != _c_strides(shape, dtype.itemsize):
        raise ValueError(f"a strided device tensor (strides {tuple(strides)}); pass a contiguous one")
    ptr, _readonly = cai["data"]
    return DeviceView(int(ptr or 0), dtype, shape)


def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    out, step = [], itemsize
    for d in reversed(shape):
        out.append(step)
        step *= d
    return tuple(reversed(out))


def _device_feed(name: str, value: object, t: TensorType, allow: bool) -> DeviceView | None:
    try:
        view = device_view(value)
    except ValueError as e:
        raise InputError(f"input {name!r}: {e}") from None
    if view is None:
        return None
    if not allow:
        raise InputError(f"input {name!r} is a GPU tensor; this plan runs on the CPU: pass a host array")
    _check_type(name, view.dtype, view.shape, t, "on the GPU")
    return view


class FeedChecker:
    """``check_feeds`` for one fixed list of inputs, with a fast path for the common case
    (every feed already a numpy array of the right dtype and shape); anything else goes
    through ``check_feeds``, which converts or raises the InputError."""

    def __init__(self, expected: Sequence[tuple[str, TensorType]], allow_device: bool = False) -> None:
        self._expected = list(expected)
        self._allow_device = allow_device
        self._want = [(n, t.dtype.numpy, tuple(t.shape)) for n, t in expected]

    def __call__(self, feeds: Mapping[str, object]) -> Mapping[str, np.ndarray]:
        if len(feeds) == len(self._want):
            for name, dtype, shape in self._want:
                a = feeds.get(name)
                if type(a) is not np.ndarray or a.dtype != dtype or a.shape != shape:
                    break
            else:
                return feeds  # type: ignore[return-value]
        return check_feeds(self._expected, feeds, self._allow_device)
