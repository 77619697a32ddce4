"""Outputs that stay on the GPU.

A GPU tensor fed to a CUDA plan (DLPack or ``__cuda_array_interface__``: torch, CuPy, JAX;
see ``tilefuse/feeds.py``) is read where it lives: the CUDA runtime copies it device to
device into the plan's input buffer. When any feed is such a tensor, the outputs come back
as ``DeviceArray``: device memory of their own that other libraries take without a copy,
through DLPack (``torch.from_dlpack(out)``, ``cupy.from_dlpack(out)``,
``jax.dlpack.from_dlpack(out)``) or ``__cuda_array_interface__``
(``torch.as_tensor(out, device="cuda")``, ``cupy.asarray(out)``), with ``numpy()`` for a
host copy.
"""
from __future__ import annotations

import numpy as np

from tilefuse import dlpack
from tilefuse.ir.dtypes import DType


class DeviceArray:
    """An output in device memory owned by this object (freed with it, and not before
    every tensor that borrowed it through DLPack is gone)."""

    def __init__(self, ptr: int, dtype: np.dtype, shape: tuple[int, ...], executor, device: int = 0) -> None:
        self.ptr, self.dtype, self.shape, self.device = ptr, np.dtype(dtype), tuple(shape), device
        self._executor = executor

    @classmethod
    def made(cls, ptr: int, dtype: np.dtype, shape: tuple[int, ...], executor, device: int) -> DeviceArray:
        """An array of a dtype and shape already normalised (a steady run makes one per
        output: ``__init__``'s conversions are a microsecond there)."""
        a = cls.__new__(cls)
        a.ptr, a.dtype, a.shape, a.device, a._executor = ptr, dtype, shape, device, executor
        return a

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False), "strides": None,
                "version": 3, "stream": None}

    def __dlpack__(self, *, stream: int | None = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> object:
        """A DLPack capsule over this array's memory, which stays allocated until the
        consumer lets go of it. The capsule is the unversioned "dltensor" whatever
        ``max_version`` asks (consumers accept it). ``stream`` is not waited on: ``run``
        returns only when the outputs are written, so any stream may read them at once."""
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"{self!r} is on cuda:{self.device}; it cannot be exported to device {tuple(dl_device)}")
        if copy:
            raise BufferError(f"{self!r} exports its own memory only; copy it on the consumer's side")
        return dlpack.export_capsule(self.ptr, DType.from_numpy(self.dtype), self.shape,
                                     self.__dlpack_device__(), owner=self)

    def __dlpack_device__(self) -> tuple[int, int]:
        return int(dlpack.DLDeviceType.CUDA), self.device

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
