"""Checking user-supplied inputs against what a model or plan expects."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from tilefuse.errors import InputError
from tilefuse.ir.dtypes import DType
from tilefuse.ir.types import TensorType


def check_feeds(expected: Sequence[tuple[str, TensorType]], feeds: Mapping[str, object]) -> dict[str, np.ndarray]:
    """Return the feeds as numpy arrays, or raise InputError naming what is wrong.

    Every expected input must be given with exactly its dtype and shape; unknown names
    are an error too (a typo would otherwise be silently ignored).
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
