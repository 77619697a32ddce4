"""ort stage: tilefuse inside onnxruntime.

Three pieces, on top of the compiler and the plan (nothing below imports this package):

- ``export_ort``: a model whose fused groups are tilefuse kernels, as ``EPContext``
  nodes for the plugin execution provider or ``ai.tilefuse`` nodes for the custom-op
  library; nodes tilefuse cannot run stay ordinary ONNX nodes for onnxruntime.
- the plugin execution provider (onnxruntime >= 1.23): ``get_library_path``,
  ``get_ep_name``, ``register`` and ``session_options``.
- the custom-op library (any onnxruntime with C API 16): ``export-ort --as custom-ops``
  copies it beside the model; ``so.register_custom_ops_library(path)`` loads it.

The C libraries are built from ``csrc/`` on first use with the system C compiler.
"""
from __future__ import annotations

from pathlib import Path

from tilefuse.errors import TilefuseError
from tilefuse.ort.export import ExportResult, export_ort
from tilefuse.ort.stitch import EP_NAME

MIN_EP_VERSION = (1, 23)  # plugin providers that compile nodes

__all__ = ["EP_NAME", "ExportResult", "custom_ops_library_path", "export_ort", "get_ep_name", "get_library_path",
           "register", "session_options"]


def get_library_path() -> str:
    """Absolute path of the plugin execution provider library (built on first use)."""
    from tilefuse.ort.build import library

    return str(library("ep"))


def custom_ops_library_path() -> str:
    """Absolute path of the generic custom-op library; export-ort copies it beside the
    model, and that copy is the one to register (it finds the kernels beside itself)."""
    from tilefuse.ort.build import library

    return str(library("custom-ops"))


def get_ep_name() -> str:
    return EP_NAME


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("+")[0].split(".")[:2] if x.isdigit())


def register(name: str = EP_NAME) -> str:
    """Register the provider library with onnxruntime (once per process); its name."""
    import onnxruntime as ort

    if _version(ort.__version__) < MIN_EP_VERSION:
        raise TilefuseError(f"the tilefuse execution provider needs onnxruntime >= 1.23, this is {ort.__version__}; "
                            "export with --as custom-ops and register the custom-op library instead")
    if not any(d.ep_name == EP_NAME for d in ort.get_ep_devices()):
        ort.register_execution_provider_library(name, str(Path(get_library_path()).resolve()))
    return name


def session_options(options: object | None = None) -> object:
    """``onnxruntime.SessionOptions`` (``options`` or a new one) with the tilefuse
    provider added for its CPU device; registers the library first if needed."""
    import onnxruntime as ort

    register()
    so = options if options is not None else ort.SessionOptions()
    devices = [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME]
    if not devices:
        raise TilefuseError("onnxruntime lists no device for the tilefuse execution provider after registering it")
    so.add_provider_for_devices(devices, {})
    return so
