"""tilefuse: a whole-model fusion compiler for ONNX.

Stages, in the order data flows (see DESIGN.md): frontend -> ir -> partition ->
tile_ir -> codegen -> plan, runtime -> ort.

The entry points below are imported on first use, so that a light piece (``tilefuse.compare``,
the onnxruntime provider helpers in ``tilefuse.ort``) can be imported on a machine that
has numpy and onnxruntime but not the compiler's dependencies.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tilefuse import errors
    from tilefuse.compiler import compile
    from tilefuse.frontend import import_onnx
    from tilefuse.session import InferenceSession, SessionOptions

__version__ = "0.1.0"
__all__ = ["InferenceSession", "SessionOptions", "compile", "errors", "import_onnx", "__version__"]

_LAZY = {"errors": ("tilefuse.errors", None), "import_onnx": ("tilefuse.frontend", "import_onnx"),
         "compile": ("tilefuse.compiler", "compile"), "InferenceSession": ("tilefuse.session", "InferenceSession"),
         "SessionOptions": ("tilefuse.session", "SessionOptions")}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module 'tilefuse' has no attribute {name!r}")
    module, attr = _LAZY[name]
    value = importlib.import_module(module)
    return getattr(value, attr) if attr else value
