"""runtime stage: load a ``.tfplan`` and run it (cpu through ctypes; cuda to come).

``InferenceSession(path_or_plan)`` has onnxruntime's shape: ``get_inputs()``,
``get_outputs()``, ``run(output_names, feeds)``.
"""
from tilefuse.runtime.device_array import DeviceArray
from tilefuse.runtime.session import EXECUTORS, InferenceSession, NodeArg

__all__ = ["EXECUTORS", "DeviceArray", "InferenceSession", "NodeArg"]
