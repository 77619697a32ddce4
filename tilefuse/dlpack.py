"""DLPack: handing tensors between libraries without copying them (the unversioned ABI).

A producer's ``__dlpack__(stream=...)`` returns a PyCapsule named "dltensor" around a
``DLManagedTensor``. The consumer takes the pointer, renames the capsule "used_dltensor" (so
the producer's capsule destructor leaves the tensor alone) and calls the tensor's
``deleter`` once, when it no longer reads the memory. A capsule destroyed while still
named "dltensor" was never consumed: its destructor calls the deleter instead.

This module is both ends of that handshake, with ctypes and the CPython capsule API only
(no torch, no compiled helper):

- ``consume(capsule)`` takes a producer's capsule and returns an ``Imported`` tensor:
  where its data is, its device, dtype, shape and strides; ``release()`` (or garbage
  collection) calls the producer's deleter exactly once;
- ``export_capsule(...)`` wraps memory that a Python object owns in a new "dltensor"
  capsule; the managed tensor keeps that object alive until the consumer calls the
  deleter, or until the capsule is destroyed unconsumed.

Struct layouts and constants are dlpack.h's (the ``DLManagedTensor`` of v0.8, kept
unchanged as the legacy struct by DLPack 1.x). The versioned capsule ("dltensor_versioned")
is not produced or read: consumers and producers all still speak the legacy one when no
``max_version`` is asked for.
"""
from __future__ import annotations

import ctypes
import enum

from tilefuse.ir.dtypes import DType


class DLDeviceType(enum.IntEnum):
    CPU = 1
    CUDA = 2
    CUDA_HOST = 3  # pinned host memory
    OPENCL = 4
    VULKAN = 7
    METAL = 8
    VPI = 9
    ROCM = 10
    ROCM_HOST = 11
    EXT_DEV = 12
    CUDA_MANAGED = 13
    ONE_API = 14
    WEBGPU = 15
    HEXAGON = 16


class DLDataTypeCode(enum.IntEnum):
    INT = 0
    UINT = 1
    FLOAT = 2
    OPAQUE_HANDLE = 3
    BFLOAT = 4
    COMPLEX = 5
    BOOL = 6


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    # shape and strides count elements, not bytes; strides NULL means C-contiguous
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


# void (*deleter)(DLManagedTensor *self); may be called from any thread, without the GIL
# (a ctypes callback takes the GIL itself; calling a producer's deleter releases it).
_Deleter = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]


_DTYPES: dict[tuple[int, int], DType] = {
    (DLDataTypeCode.INT, 8): DType.INT8, (DLDataTypeCode.INT, 16): DType.INT16,
    (DLDataTypeCode.INT, 32): DType.INT32, (DLDataTypeCode.INT, 64): DType.INT64,
    (DLDataTypeCode.UINT, 8): DType.UINT8, (DLDataTypeCode.UINT, 16): DType.UINT16,
    (DLDataTypeCode.UINT, 32): DType.UINT32, (DLDataTypeCode.UINT, 64): DType.UINT64,
    (DLDataTypeCode.FLOAT, 16): DType.FLOAT16, (DLDataTypeCode.FLOAT, 32): DType.FLOAT32,
    (DLDataTypeCode.FLOAT, 64): DType.FLOAT64, (DLDataTypeCode.BFLOAT, 16): DType.BFLOAT16,
    (DLDataTypeCode.BOOL, 8): DType.BOOL,
}
_CODES = {dtype: code for code, dtype in _DTYPES.items()}

# The capsule API, with prototypes of our own (setting argtypes on ctypes.pythonapi's shared
# function objects would change them for every other user). PYFUNCTYPE keeps the GIL and
# turns a set Python error into an exception.
_api = ctypes.pythonapi
_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_GetPointer", _api))
_set_name = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_SetName", _api))
_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_new_capsule = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, _CapsuleDestructor)(
    ("PyCapsule_New", _api))
# The same calls on a capsule that is being destroyed: it is passed as a bare address,
# never turned back into a Python object (that would resurrect it).
_is_valid_raw = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_get_pointer_raw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(("PyCapsule_GetPointer", _api))

# A capsule keeps the address of its name, not a copy: these bytes live as long as the module.
DLTENSOR = b"dltensor"
USED_DLTENSOR = b"used_dltensor"


def dtype_of(code: int, bits: int, lanes: int = 1) -> DType:
    """The tilefuse dtype of a DLPack element type; ValueError for one tilefuse has not."""
    dtype = _DTYPES.get((code, bits)) if lanes == 1 else None
    if dtype is None:
        try:
            name = f"{DLDataTypeCode(code).name.lower()}{bits}"
        except ValueError:
            name = f"(code {code}, {bits} bits)"
        raise ValueError(f"DLPack dtype {name}" + (f"x{lanes}" if lanes != 1 else "") + " has no tilefuse dtype")
    return dtype


def device_name(device_type: int) -> str:
    try:
        return DLDeviceType(device_type).name
    except ValueError:
        return f"device type {device_type}"


def device_of(obj: object) -> tuple[int, int] | None:
    """``obj.__dlpack_device__()`` as (device type, device id), or None if ``obj`` is no
    DLPack producer."""
    if not hasattr(obj, "__dlpack__"):
        return None
    where = getattr(obj, "__dlpack_device__", None)
    if where is None:
        return None
    device_type, device_id = where()
    return int(device_type), int(device_id)


class Imported:
    """A consumed DLPack tensor. ``data`` (the tensor's pointer plus its byte offset) may be
    read until ``release()``, which calls the producer's deleter; dropping the object
    releases it too."""

    __slots__ = ("data", "device", "dtype", "shape", "strides", "_managed", "_capsule")

    def __init__(self, capsule: object) -> None:
        self._managed: int | None = None
        managed = _get_pointer(capsule, DLTENSOR)  # ValueError if it is not an unused "dltensor"
        _set_name(capsule, USED_DLTENSOR)
        self._managed, self._capsule = managed, capsule  # ours now: the deleter is our call
        try:
            t = DLManagedTensor.from_address(managed).dl_tensor
            self.device = (int(t.device.device_type), int(t.device.device_id))
            self.dtype = dtype_of(t.dtype.code, t.dtype.bits, t.dtype.lanes)
            self.shape = tuple(int(t.shape[i]) for i in range(t.ndim))
            self.strides = tuple(int(t.strides[i]) for i in range(t.ndim)) if t.strides else None
            self.data = int(t.data or 0) + int(t.byte_offset)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Hand the tensor back to its producer (once; later calls do nothing)."""
        managed, self._managed = self._managed, None
        if managed:
            deleter = DLManagedTensor.from_address(managed).deleter
            if deleter:
                deleter(managed)

    def __del__(self) -> None:
        self.release()


def consume(capsule: object) -> Imported:
    """Take ownership of a producer's "dltensor" capsule (see ``Imported``)."""
    return Imported(capsule)


class _Export:
    """What one exported managed tensor points into, kept alive by ``_LIVE``."""

    __slots__ = ("managed", "shape", "strides", "owner")

    def __init__(self, managed, shape, strides, owner) -> None:
        self.managed, self.shape, self.strides, self.owner = managed, shape, strides, owner


# address of an exported DLManagedTensor -> its _Export; the deleter removes the entry,
# and with it the last reference to the structs and to the memory's owner.
_LIVE: dict[int, _Export] = {}


@_Deleter
def _delete_export(managed: int) -> None:
    try:
        _LIVE.pop(managed, None)
    except Exception:  # noqa: BLE001 - interpreter teardown: the module is gone
        pass


@_CapsuleDestructor
def _destroy_capsule(capsule: int) -> None:
    if _is_valid_raw(capsule, DLTENSOR):  # never consumed: the deleter is ours to call
        _delete_export(_get_pointer_raw(capsule, DLTENSOR))


def export_capsule(data: int, dtype: DType, shape: tuple[int, ...], device: tuple[int, int],
                   owner: object) -> object:
    """A "dltensor" capsule over the C-contiguous tensor at ``data`` on ``device`` ((device
    type, id)). ``owner`` (what owns the memory) stays referenced until the consumer calls
    the deleter, or the capsule is destroyed unconsumed. Strides are always written out:
    some consumers predate the NULL-means-contiguous rule."""
    ndim = len(shape)
    strides, step = [0] * ndim, 1
    for axis in reversed(range(ndim)):
        strides[axis], step = step, step * int(shape[axis])
    shape_array = (ctypes.c_int64 * max(ndim, 1))(*shape)
    strides_array = (ctypes.c_int64 * max(ndim, 1))(*strides)
    code, bits = _CODES[dtype]
    managed = DLManagedTensor()
    tensor = managed.dl_tensor
    tensor.data = data
    tensor.device = DLDevice(*device)
    tensor.ndim = ndim
    tensor.dtype = DLDataType(code, bits, 1)
    tensor.shape = ctypes.cast(shape_array, ctypes.POINTER(ctypes.c_int64))
    tensor.strides = ctypes.cast(strides_array, ctypes.POINTER(ctypes.c_int64))
    tensor.byte_offset = 0
    managed.deleter = _delete_export
    address = ctypes.addressof(managed)
    _LIVE[address] = _Export(managed, shape_array, strides_array, owner)
    return _new_capsule(address, DLTENSOR, _destroy_capsule)
