"""torch CUDA tensors read through their own attributes: the fast path for the most common
device feed.

DLPack reads any producer's tensor, but torch's ``__dlpack__(stream=...)`` is Python that
creates a CUDA event per call to order its stream before the consumer's, and wraps the
tensor in a capsule: about half of what ``run()`` added over the graph replay with two
torch feeds (benchmarks/RESULTS.md, session 10). A torch CUDA tensor says everything the
runtime needs itself: its address (``data_ptr()``), dtype, shape, contiguity and device, and
the stream its pending writes are on is torch's current stream for that device; the
runtime waits for that stream with an event of its own (as for a
``__cuda_array_interface__`` feed that names its stream). Anything this path does not take
(a dtype numpy has no name for, a conjugate or negative view) goes through DLPack, which
reads or refuses it as it always did. Nothing here imports torch: a tensor's own module
is asked for its current stream.
"""
from __future__ import annotations

import sys

import numpy as np

# torch dtypes whose numpy names are the same; bfloat16 (no numpy dtype) goes through DLPack
_DTYPES = {f"torch.{n}": np.dtype(n) for n in ("float64", "float32", "float16", "int64", "int32", "int16", "int8",
                                                "uint8", "bool")}
CU_STREAM_LEGACY = 1  # the driver's handle of the legacy default stream (torch's stream 0)


def is_torch_cuda(obj: object) -> bool:
    """Whether ``obj`` is a torch tensor in CUDA memory (without importing torch)."""
    return type(obj).__module__.partition(".")[0] == "torch" and getattr(obj, "is_cuda", False) is True


def torch_view(obj: object, index: int, stream: int | None,
               current: int | None = None) -> tuple[int, np.dtype, tuple[int, ...], object, str, int] | None:
    """``(ptr, dtype, shape, keep, ready, stream)`` of a torch CUDA tensor for a runtime on
    device ``index`` reading on ``stream`` (None: the legacy default stream), or None where
    DLPack is to read it; ``current``: torch's current stream on that device where the
    caller asked already (one run's feeds share it). Raises ValueError for a tensor the
    runtime cannot read as it is."""
    if not is_torch_cuda(obj):
        return None
    t = obj  # a torch.Tensor: its methods are torch's public API
    dtype = numpy_dtype(t.dtype)  # type: ignore[attr-defined]
    # (a conjugate view is complex, which has no entry; a negative view can be real)
    if dtype is None or t.is_neg():  # type: ignore[attr-defined]
        return None
    device = t.get_device()  # type: ignore[attr-defined]
    if device != index:
        raise ValueError(f"a tensor on cuda:{device}; this session runs on cuda:{index}")
    if not t.is_contiguous():  # type: ignore[attr-defined]
        raise ValueError(f"a strided device tensor (strides {tuple(t.stride())} elements); pass a contiguous one")  # type: ignore[attr-defined]
    if current is None:
        current = current_stream(obj, device)
    ours = stream or CU_STREAM_LEGACY
    ready = "ordered" if current == ours else "stream"  # on our own stream, work is in order
    return t.data_ptr(), dtype, tuple(t.shape), obj, ready, current  # type: ignore[attr-defined]


def numpy_dtype(dtype: object) -> np.dtype | None:
    """The numpy dtype of a torch dtype (remembered by the dtype object: its name is a
    string made per call)."""
    try:
        return _SEEN[dtype]
    except KeyError:
        _SEEN[dtype] = found = _DTYPES.get(str(dtype))
        return found


_SEEN: dict[object, np.dtype | None] = {}


def current_stream(tensor: object, device: int) -> int:
    """torch's current stream on CUDA ``device``, as the driver's handle, asked of the
    module ``tensor`` (a torch tensor) comes from: the raw handle torch's own generated
    code asks for (a tenth of ``torch.cuda.current_stream``'s time, which builds a Stream
    object), else through the public call."""
    torch = sys.modules[type(tensor).__module__.partition(".")[0]]
    raw = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return int(raw(device)) or CU_STREAM_LEGACY
    return int(torch.cuda.current_stream(device).cuda_stream) or CU_STREAM_LEGACY
