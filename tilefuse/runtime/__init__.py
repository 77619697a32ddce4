"""runtime stage: load a ``.tfplan`` and run it (cpu through ctypes; cuda through the
CUDA driver API).

``InferenceSession(path_or_plan, threads=N)`` has onnxruntime's shape: ``get_inputs()``,
``get_outputs()``, ``run(output_names, feeds)``; ``threads`` is its ``intra_op_num_threads``.
A CUDA session also takes GPU tensors (DLPack or ``__cuda_array_interface__``) and then
returns ``DeviceArray``s, which export both.
"""
from tilefuse.runtime.device_array import DeviceArray
from tilefuse.runtime.session import InferenceSession, NodeArg

__all__ = ["DeviceArray", "InferenceSession", "NodeArg"]
