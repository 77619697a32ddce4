"""The plugin execution providers as onnxruntime sees them: their names, their library,
registering it, the session options that add a provider, and what hardware onnxruntime
offers. Needs only onnxruntime (and a C compiler the first time ``get_library_path``
builds the library; ``library=`` takes one built elsewhere), so a machine that only runs
exported models needs neither onnx nor the compiler.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tilefuse.errors import TilefuseError

if TYPE_CHECKING:  # onnxruntime is imported where it is used: importing tilefuse.ort needs none
    from onnxruntime import SessionOptions

EP_NAME = "TilefuseExecutionProvider"  # claims the EPContext nodes of CPU kernels
CUDA_EP_NAME = "TilefuseCudaExecutionProvider"  # those of CUDA kernels, on an NVIDIA GPU
MIN_EP_VERSION = (1, 23)  # plugin providers that compile nodes


def get_library_path() -> str:
    """Absolute path of the plugin execution provider library (built on first use)."""
    from tilefuse.ort.build import library

    return str(library("ep"))


def custom_ops_library_path() -> str:
    """Absolute path of the generic custom-op library; export-ort copies it beside the
    model, and that copy is the one to register (it finds the kernels beside itself)."""
    from tilefuse.ort.build import library

    return str(library("custom-ops"))


def get_ep_name(target: str = "cpu") -> str:
    """The provider that runs kernels exported for ``target`` ("cpu", or "cuda[:arch]")."""
    return CUDA_EP_NAME if target.startswith("cuda") else EP_NAME


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("+")[0].split(".")[:2] if x.isdigit())


def register(name: str = EP_NAME, library: str | Path | None = None) -> str:
    """Register the provider library with onnxruntime (once per process); its name.

    ``library``: a built library to use (for example one carried to a machine without a C
    compiler) instead of building ``get_library_path()``.
    """
    import onnxruntime as ort

    if _version(ort.__version__) < MIN_EP_VERSION:
        raise TilefuseError(f"the tilefuse execution provider needs onnxruntime >= 1.23, this is {ort.__version__}; "
                            "export with --as custom-ops and register the custom-op library instead")
    if not any(d.ep_name == EP_NAME for d in ort.get_ep_devices()):
        path = Path(library) if library is not None else Path(get_library_path())
        ort.register_execution_provider_library(name, str(path.resolve()))
    return name


def hardware_devices() -> list[str]:
    """What onnxruntime offers plugin providers, one line per hardware device ("GPU vendor
    0x10de device 0x2335 {...}"): from ``get_hardware_devices`` where onnxruntime has it,
    else the devices of the providers it lists."""
    import onnxruntime as ort
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    listed = getattr(C, "get_hardware_devices", None)
    devices = listed() if listed else list({id(d.device): d.device for d in ort.get_ep_devices()}.values())
    return [f"{d.type.name} vendor 0x{d.vendor_id:04x} ({d.vendor or '?'}) device 0x{d.device_id:04x} "
            f"{dict(d.metadata)}" for d in devices]


def session_options(options: SessionOptions | None = None, target: str = "cpu",
                    library: str | Path | None = None) -> SessionOptions:
    """``onnxruntime.SessionOptions`` (``options`` or a new one) with the tilefuse provider
    for ``target`` added: the CPU provider for its CPU device, or for "cuda" the CUDA
    provider for its GPU. Registers the library first if needed (``library`` as for
    ``register``)."""
    import onnxruntime as ort

    register(library=library)
    name = get_ep_name(target)
    so = options if options is not None else ort.SessionOptions()
    devices = [d for d in ort.get_ep_devices() if d.ep_name == name]
    if not devices:
        where = "; ".join(hardware_devices()) or "none"
        raise TilefuseError(f"onnxruntime lists no device for {name} after registering the library. "
                            f"Hardware devices onnxruntime offers: {where}" +
                            (". The CUDA provider takes an NVIDIA GPU (vendor 0x10de), or, where onnxruntime "
                             "offers none, the first GPU the CUDA driver (libcuda.so.1) sees; neither is here"
                             if name == CUDA_EP_NAME else ""))
    so.add_provider_for_devices(devices[:1], {})
    return so
