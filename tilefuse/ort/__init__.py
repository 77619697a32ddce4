"""ort stage: tilefuse inside onnxruntime.

Three pieces, on top of the compiler and the plan (nothing below imports this package):

- ``export_ort``: a model whose fused groups are tilefuse kernels, as ``EPContext``
  nodes for the plugin execution provider or ``ai.tilefuse`` nodes for the custom-op
  library; nodes tilefuse cannot run stay ordinary ONNX nodes for onnxruntime.
- the plugin execution providers (onnxruntime >= 1.23), one library with two: the CPU
  provider and the CUDA provider, which serves an NVIDIA GPU with its own allocator and
  copies (so it runs on a CPU-only onnxruntime build): ``get_library_path``,
  ``get_ep_name``, ``register``, ``session_options`` (``target="cuda"`` for the GPU) and
  ``hardware_devices``.
- the custom-op library (any onnxruntime with C API 16): ``export-ort --as custom-ops``
  copies it beside the model; ``so.register_custom_ops_library(path)`` loads it.

The C libraries are built from ``csrc/`` on first use with the system C compiler.
The provider helpers (``provider.py``) need only onnxruntime; ``export_ort`` is imported
on first use.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from tilefuse.ort.provider import (
    CUDA_EP_NAME,
    EP_NAME,
    MIN_EP_VERSION,
    _version,
    custom_ops_library_path,
    get_ep_name,
    get_library_path,
    hardware_devices,
    register,
    session_options,
)

if TYPE_CHECKING:
    from tilefuse.ort.export import ExportResult, export_ort

__all__ = ["CUDA_EP_NAME", "EP_NAME", "MIN_EP_VERSION", "ExportResult", "_version", "custom_ops_library_path",
           "export_ort", "get_ep_name", "get_library_path", "hardware_devices", "register", "session_options"]


def __getattr__(name: str) -> object:
    if name in ("export_ort", "ExportResult"):  # the compiler, onnx: only where models are exported
        from tilefuse.ort import export

        return getattr(export, name)
    raise AttributeError(f"module 'tilefuse.ort' has no attribute {name!r}")
