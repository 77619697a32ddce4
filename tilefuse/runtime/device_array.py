"""Outputs that stay on the GPU.

A feed that exposes ``__cuda_array_interface__`` (a torch CUDA tensor, a CuPy or Numba
array) is read where it lives (``tilefuse.feeds.DeviceView``: the CUDA runtime copies it
device to device into the plan's input buffer). When any feed is such a tensor, the
outputs come back as ``DeviceArray``: device memory of their own that exposes
``__cuda_array_interface__`` too (``torch.as_tensor(out, device="cuda")``,
``cupy.asarray(out)``), with ``numpy()`` for a host copy.
"""
from __future__ import annotations

import numpy as np


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
