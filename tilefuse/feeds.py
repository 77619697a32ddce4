"""Checking user-supplied inputs against what a model or plan expects.

Host feeds become numpy arrays. A GPU tensor is recognised by DLPack (``__dlpack__`` with a
non-CPU ``__dlpack_device__``: torch, CuPy, JAX) or, failing that, by
``__cuda_array_interface__`` (Numba, older CuPy), and becomes a ``DeviceView`` that the CUDA
runtime copies device to device. DLPack is preferred where a tensor has both: it names the
tensor's device, and lets the producer order its pending work before the runtime's
stream. A CPU DLPack tensor is a host feed like any other. torch CUDA tensors are read
through their own attributes first (tilefuse/torch_feeds.py: no capsule, no event per call).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple, Protocol, Sequence, overload

import numpy as np

from tilefuse import dlpack
from tilefuse.errors import InputError
from tilefuse.ir.dtypes import DType
from tilefuse.ir.types import TensorType
from tilefuse.torch_feeds import CU_STREAM_LEGACY, current_stream, is_torch_cuda, numpy_dtype, torch_view


class _Producer(Protocol):
    """A DLPack producer, as far as a consumer calls it."""

    def __dlpack__(self, *, stream: int | None = None) -> object: ...


@dataclass(frozen=True)
class FeedDevice:
    """Where a runtime reads GPU feeds: CUDA device ``index``, and the ``stream`` it reads
    them on (a CUstream handle as an integer; None: the legacy default stream). DLPack
    producers are asked to make their tensor ready on that stream."""

    index: int = 0
    stream: int | None = None


@overload
def check_feeds(expected: Sequence[tuple[str, TensorType]], feeds: Mapping[str, object],
                device: None = None) -> dict[str, np.ndarray]: ...
@overload
def check_feeds(expected: Sequence[tuple[str, TensorType]], feeds: Mapping[str, object],
                device: FeedDevice | None) -> dict[str, np.ndarray | DeviceView]: ...


def check_feeds(expected: Sequence[tuple[str, TensorType]], feeds: Mapping[str, object],
                device: FeedDevice | None = None) -> dict[str, np.ndarray] | dict[str, np.ndarray | DeviceView]:
    """Return the feeds as numpy arrays, or raise InputError naming what is wrong.

    Every expected input must be given with exactly its dtype and shape; unknown names
    are an error too (a typo would otherwise be silently ignored). With ``device`` (a
    runtime that reads GPU memory), a GPU tensor is checked the same way and returned as
    a DeviceView; without, it is refused.
    """
    _check_mapping(feeds)
    names = [n for n, _ in expected]
    unknown = sorted(set(feeds) - set(names))
    if unknown:
        raise InputError(f"unknown input name(s) {unknown}; the model's inputs are {names}")
    missing = [n for n in names if n not in feeds]
    if missing:
        raise InputError(f"missing input(s) {missing}; the model's inputs are {names}")
    out: dict[str, np.ndarray | DeviceView] = {}
    for name, t in expected:
        view = _device_feed(name, feeds[name], t, device)
        if view is not None:
            out[name] = view
            continue
        value = feeds[name]
        array = _host_array(name, value, t)
        try:
            _check_type(name, array.dtype, tuple(array.shape), t)
        except InputError as e:
            if isinstance(value, (list, tuple)):  # numpy picked the dtype: say how to choose it
                raise InputError(f"{e} (from a Python {type(value).__name__}: pass np.asarray(..., dtype=np.{t.dtype.numpy.name}))") from None
            raise
        out[name] = array
    return out


def _check_mapping(feeds: object) -> None:
    """InputError unless ``feeds`` maps input names (strings) to values, as onnxruntime's do."""
    if not isinstance(feeds, Mapping):
        raise InputError(f"feeds must be a dict of input name -> array, got {_show(feeds)}")
    keys = [k for k in feeds if not isinstance(k, str)]
    if keys:
        raise InputError(f"feed names must be input names (strings), got {', '.join(_show(k) for k in keys[:3])}")


def _show(x: object) -> str:
    """``x`` for an error message: its type, and its repr when that is short."""
    text = repr(x)
    return type(x).__name__ + (f" {text}" if len(text) <= 40 and x is not None else "")


def _host_array(name: str, value: object, t: TensorType) -> np.ndarray:
    if value is None or isinstance(value, (str, bytes)):
        raise InputError(f"input {name!r}: expected an array of {t}, got {_show(value)}")
    # A bare DLPack producer (only __dlpack__) is read in place by numpy; torch CPU
    # tensors and the like convert through __array__.
    if hasattr(value, "__dlpack__") and dlpack.device_of(value) is not None and not hasattr(value, "__array__"):
        try:
            return np.from_dlpack(value)
        except (BufferError, RuntimeError, TypeError, ValueError) as e:
            raise InputError(f"input {name!r}: numpy cannot read this DLPack tensor: {e}") from None
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as e:  # ragged nested lists, objects numpy cannot read
        raise InputError(f"input {name!r}: not an array of {t}: {e}") from None
    if array.dtype.kind in "OSU":  # objects or strings: numpy found no numbers (bfloat16 is "V")
        raise InputError(f"input {name!r}: expected an array of {t}, got {_show(value)}")
    return array


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


class DeviceView(NamedTuple):
    """A borrowed, C-contiguous device tensor: where it is, its dtype and shape. ``keep``
    holds what must stay alive while the runtime reads it (a consumed DLPack tensor, handed
    back to its producer when the view is dropped). A named tuple: a run makes one per GPU
    feed, and a tuple is made in a fifth of a frozen dataclass's time."""

    ptr: int
    dtype: np.dtype
    shape: tuple[int, ...]
    keep: object = None
    # how the tensor's pending writes are ordered before the runtime reads it: "ordered"
    # (DLPack: the producer made the runtime's stream wait), "ready" (nothing pending),
    # "stream" (wait for ``stream``, a CUstream handle: 1 the legacy default stream, 2 the
    # per-thread one, as __cuda_array_interface__ v3 numbers them and the driver too) or
    # "unknown" (an interface that names no stream: wait for the whole device)
    ready: str = "ordered"
    stream: int = 0

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def on_device(obj: object) -> bool:
    """True if ``obj`` is a tensor in device memory (DLPack on a device other than the
    CPU, or ``__cuda_array_interface__``)."""
    if is_torch_cuda(obj):
        return True
    where = dlpack.device_of(obj)
    if where is not None:
        return where[0] != dlpack.DLDeviceType.CPU
    return hasattr(obj, "__cuda_array_interface__")


def device_view(obj: object, device: FeedDevice = FeedDevice()) -> DeviceView | None:
    """The device tensor behind ``obj``, or None if it is not one. Raises ValueError for a
    device tensor the runtime cannot read as it is (strided, a dtype tilefuse lacks, not
    on ``device``). A DLPack tensor is consumed here: the view keeps it until dropped."""
    fast = torch_view(obj, device.index, device.stream)  # torch's own attributes: no capsule, no event
    if fast is not None:
        ptr, dtype, shape, keep, ready, stream = fast
        return DeviceView(ptr, dtype, shape, keep=keep, ready=ready, stream=stream if ready == "stream" else 0)
    where = dlpack.device_of(obj)
    # hasattr holds whenever device_of found a device: it tells the type checker so.
    if where is not None and where[0] != dlpack.DLDeviceType.CPU and hasattr(obj, "__dlpack__"):
        return _dlpack_view(obj, where, device)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is None:
        return None
    shape = tuple(int(d) for d in cai["shape"])
    dtype = np.dtype(cai["typestr"])
    strides = cai.get("strides")
    if strides is not None and not _c_contiguous(shape, tuple(strides), dtype.itemsize):
        raise ValueError(f"a strided device tensor (strides {tuple(strides)}); pass a contiguous one")
    ptr, _readonly = cai["data"]
    if "stream" not in cai:  # before version 3: nothing says where it was written
        return DeviceView(int(ptr or 0), dtype, shape, ready="unknown")
    stream = cai["stream"]
    if stream is None:
        return DeviceView(int(ptr or 0), dtype, shape, ready="ready")
    if isinstance(stream, bool) or not isinstance(stream, int) or stream == 0:
        raise ValueError(f"its __cuda_array_interface__ names stream {stream!r}; the interface allows None, 1, 2 "
                         f"or a stream handle")
    return DeviceView(int(ptr or 0), dtype, shape, ready="stream", stream=int(stream))


def _dlpack_view(obj: _Producer, where: tuple[int, int], device: FeedDevice) -> DeviceView:
    kind, index = where
    if kind not in (dlpack.DLDeviceType.CUDA, dlpack.DLDeviceType.CUDA_MANAGED):
        raise ValueError(f"a tensor on {dlpack.device_name(kind)}; this runtime reads CUDA tensors")
    if index != device.index:
        raise ValueError(f"a tensor on cuda:{index}; this session runs on cuda:{device.index}")
    # The array API's stream rule for CUDA: our stream's handle, or None for the legacy
    # default stream; the producer makes that stream wait for its pending writes.
    try:
        capsule = obj.__dlpack__(stream=device.stream)
    except (BufferError, RuntimeError, TypeError, ValueError) as e:
        raise ValueError(f"its __dlpack__ failed: {e}") from None
    tensor = dlpack.consume(capsule)
    itemsize = tensor.dtype.itemsize
    if tensor.strides is not None and not _c_contiguous(tensor.shape, tuple(s * itemsize for s in tensor.strides),
                                                        itemsize):
        tensor.release()
        raise ValueError(f"a strided device tensor (strides {tensor.strides} elements); pass a contiguous one")
    return DeviceView(tensor.data, tensor.dtype.numpy, tensor.shape, keep=tensor)


def _c_contiguous(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> bool:
    """True if byte ``strides`` lay ``shape`` out row-major without gaps (the stride of an
    axis of length 1 is never used, so it may be anything; an empty tensor reads nothing)."""
    if 0 in shape:
        return True
    step = itemsize
    for d, s in zip(reversed(shape), reversed(strides)):
        if d != 1 and s != step:
            return False
        step *= d
    return True


def _device_feed(name: str, value: object, t: TensorType, device: FeedDevice | None) -> DeviceView | None:
    if not on_device(value):
        return None
    if device is None:
        raise InputError(f"input {name!r} is a GPU tensor; this plan runs on the CPU: pass a host array")
    try:
        view = device_view(value, device)
    except ValueError as e:
        raise InputError(f"input {name!r}: {e}") from None
    assert view is not None
    try:
        _check_type(name, view.dtype, view.shape, t, "on the GPU")
    except InputError:
        if isinstance(view.keep, dlpack.Imported):
            view.keep.release()  # now, not whenever the traceback goes
        raise
    return view


class FeedChecker:
    """``check_feeds`` for one fixed list of inputs, with a fast path for the common case
    (every feed already a numpy array of the right dtype and shape); anything else goes
    through ``check_feeds``, which converts or raises the InputError."""

    def __init__(self, expected: Sequence[tuple[str, TensorType]], device: FeedDevice | None = None) -> None:
        self._expected = list(expected)
        self._device = device
        self._want = [(n, t.dtype.numpy, tuple(t.shape)) for n, t in expected]
        self._tensor_type: type | None = None

    def __call__(self, feeds: Mapping[str, object]) -> Mapping[str, np.ndarray | DeviceView]:
        # A dict holding exactly the expected names needs no further check of its keys.
        if isinstance(feeds, dict) and len(feeds) == len(self._want):
            for name, dtype, shape in self._want:
                a = feeds.get(name)
                if type(a) is not np.ndarray or a.dtype != dtype or a.shape != shape:
                    break
            else:
                return feeds
            if self._device is not None:
                views = self._torch_views(feeds)
                if views is not None:
                    return views
        return check_feeds(self._expected, feeds, self._device)

    def _torch_views(self, feeds: dict[str, object]) -> dict[str, DeviceView] | None:
        """Every feed a torch CUDA tensor of the expected dtype and shape, contiguous and
        on the session's device, read as ``torch_view`` reads one (torch's current stream
        asked once); None for anything else, which ``check_feeds`` reads or refuses with
        its message. Once per run, so written out here: a few torch calls a tensor."""
        device = self._device
        assert device is not None
        index, ours = device.index, device.stream or CU_STREAM_LEGACY
        out: dict[str, DeviceView] = {}
        ready, stream = "", 0
        for name, dtype, shape in self._want:
            t: Any = feeds.get(name)  # a torch.Tensor once the type test passes: its methods are torch's API
            if type(t) is not self._tensor_type:
                if not is_torch_cuda(t):
                    return None
                self._tensor_type = type(t)  # torch.Tensor, as torch_feeds tells it without importing torch
            if not t.is_cuda or numpy_dtype(t.dtype) != dtype or t.shape != shape or t.is_neg() \
                    or t.get_device() != index or not t.is_contiguous():
                return None
            if not ready:
                current = current_stream(t, index)
                ready, stream = ("ordered", 0) if current == ours else ("stream", current)
            out[name] = DeviceView(t.data_ptr(), dtype, shape, t, ready, stream)
        return out
