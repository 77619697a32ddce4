"""tilefuse: a whole-model fusion compiler for ONNX.

Stages, in the order data flows (see DESIGN.md): frontend -> ir -> partition ->
tile_ir -> codegen -> plan, runtime -> ort.
"""
from tilefuse import errors
from tilefuse.frontend import import_onnx
from tilefuse.compiler import compile
from tilefuse.runtime import InferenceSession

__version__ = "0.1.0"
__all__ = ["InferenceSession", "compile", "errors", "import_onnx", "__version__"]
