"""Checking user-supplied inputs against what a model or plan expects."""
from __future__ import annotations

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
        try:
            got = DType.from_numpy(array.dtype)
        except TypeError:
            raise InputError(f"input {name!r}: expected {t.dtype}, got numpy dtype {array.dtype}") from None
        if got is not t.dtype:
            raise InputError(f"input {name!r}: expected dtype {t.dtype}, got {got}")
        if tuple(array.shape) != t.shape:
            raise InputError(f"input {name!r}: expected shape {list(t.shape)}, got {list(array.shape)}")
        out[name] = array
    return out


def _device_feed(name: str, value: object, t: TensorType, allow: bool):
    from tilefuse.runtime.device_array import device_view

    try:
        view = device_view(value)
    except ValueError as e:
        raise InputError(f"input {name!r}: {e}") from None
    if view is None:
        return None
    if not allow:
        raise InputError(f"input {name!r} is a GPU tensor; this plan runs on the CPU: pass a host array")
    try:
        got = DType.from_numpy(view.dtype)
    except TypeError:
        raise InputError(f"input {name!r}: expected {t.dtype}, got device dtype {view.dtype}") from None
    if got is not t.dtype:
        raise InputError(f"input {name!r}: expected dtype {t.dtype}, got {got} (on the GPU)")
    if view.shape != t.shape:
        raise InputError(f"input {name!r}: expected shape {list(t.shape)}, got {list(view.shape)} (on the GPU)")
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
