"""Tensors that live on the GPU, in and out of ``InferenceSession.run``.

A feed that exposes ``__cuda_array_interface__`` (a torch CUDA tensor, a CuPy or Numba
array) is read where it lives: its device pointer is copied device-to-device into the
plan's input buffer, with no trip through the host. When any feed is such a tensor, the
outputs come back as ``DeviceArray``: device memory of their own that exposes
``__cuda_array_interface__`` too (``torch.as_tensor(out, device="cuda")``,
``cupy.asarray(out)``), with ``numpy()`` for a host copy.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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


class DeviceArray:
    """An output in device memory owned by this object (freed with it)."""

    def __init__(self, ptr: int, dtype: np.dtype, shape: tuple[int, ...], executor) -> None:
        self.ptr, self.dtype, self.shape = ptr, np.dtype(dtype), tuple(shape)
        self._executor = executor

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False), "strides": None,
                "version": 3, "stream": None}

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def numpy(self) -> np.ndarray:
        """A host copy."""
        return self._executor.download(self)

    def __repr__(self) -> str:
        return f"DeviceArray({self.dtype}{list(self.shape)} at {self.ptr:#x})"

    def __del__(self) -> None:
        executor, self._executor = getattr(self, "_executor", None), None
        if executor is not None and self.ptr:
            executor.free(self.ptr)
