"""Frontend: ONNX in, a verified tilefuse Graph out (the only stage that imports onnx,
besides ort/ and the test helpers)."""
from tilefuse.frontend.importer import import_onnx
from tilefuse.frontend.loader import load_model

__all__ = ["import_onnx", "load_model"]
