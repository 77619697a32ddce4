"""InferenceSession: load a plan and run it, with onnxruntime's interface.

The session checks inputs and picks the executor for the plan's target; executors
(``cpu.CpuExecutor``, later ``cuda``) only run steps. An executor is built as
``Executor(plan)`` and offers ``run(feeds, output_names) -> list[np.ndarray]``, taking
checked feeds and returning fresh arrays; it must be safe to call from several threads.
An executor that reads GPU tensors says where as ``feed_device`` (a ``feeds.FeedDevice``);
the session then lets GPU feeds through as ``DeviceView``s.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from tilefuse.errors import InputError, PlanError
from tilefuse.feeds import FeedChecker
from tilefuse.ir.dtypes import DType
from tilefuse.ir.types import TensorType
from tilefuse.plan import Plan, load_plan
from tilefuse.runtime.cpu import CpuExecutor
from tilefuse.runtime.cuda import CudaExecutor

# target family (the part of a target name before ":") -> executor class
EXECUTORS = {"cpu": CpuExecutor, "cuda": CudaExecutor}

# ONNX's names for tensor element types, as onnxruntime's NodeArg.type spells them.
_ONNX_TYPE = {
    DType.FLOAT32: "float", DType.FLOAT16: "float16", DType.BFLOAT16: "bfloat16", DType.FLOAT64: "double",
    DType.INT8: "int8", DType.INT16: "int16", DType.INT32: "int32", DType.INT64: "int64",
    DType.UINT8: "uint8", DType.UINT16: "uint16", DType.UINT32: "uint32", DType.UINT64: "uint64",
    DType.BOOL: "bool",
}


@dataclass(frozen=True)
class NodeArg:
    """An input or output: ``type`` is like "tensor(float)"; shapes are static."""

    name: str
    shape: list[int]
    type: str


class InferenceSession:
    """``InferenceSession("model.tfplan")`` or ``InferenceSession(plan)``.

    ``run(output_names, feeds)`` is safe to call from several threads at once.
    """

    def __init__(self, path_or_plan: str | Path | Plan) -> None:
        self.plan = path_or_plan if isinstance(path_or_plan, Plan) else load_plan(path_or_plan)
        family = self.plan.target.split(":")[0]
        executor = EXECUTORS.get(family)
        if executor is None:
            raise PlanError(f"no runtime for target {self.plan.target!r} in this tilefuse; runtimes: {sorted(EXECUTORS)}")
        self._executor = executor(self.plan)
        self._check = FeedChecker(self.plan.input_types(), getattr(self._executor, "feed_device", None))
        self._outputs = [name for name, _ in self.plan.output_types()]

    def get_inputs(self) -> list[NodeArg]:
        return [_arg(n, t) for n, t in self.plan.input_types()]

    def get_outputs(self) -> list[NodeArg]:
        return [_arg(n, t) for n, t in self.plan.output_types()]

    def run(self, output_names: Sequence[str] | None, feeds: Mapping[str, object]) -> list[np.ndarray]:
        """The requested outputs (all when None), in that order, as fresh arrays. On a CUDA
        plan, feeds may be GPU tensors (DLPack or ``__cuda_array_interface__``: torch, CuPy,
        JAX); then the outputs are ``DeviceArray``s that stay on the GPU and export both
        (``torch.from_dlpack(out)``)."""
        names = self._output_names(output_names)
        arrays = self._check(feeds)
        return self._executor.run(arrays, names)

    def _output_names(self, output_names: object) -> list[str]:
        """``output_names`` checked: None (every output) or a list of the plan's output names."""
        if output_names is None:
            return list(self._outputs)
        if isinstance(output_names, (str, bytes)) or not isinstance(output_names, Iterable):
            what = type(output_names).__name__ + (f" {output_names!r}" if len(repr(output_names)) <= 40 else "")
            raise InputError(f"output_names must be a list of output names or None, got {what}")
        names = list(output_names)
        unknown = [n for n in names if n not in self._outputs]
        if unknown:
            raise InputError(f"unknown output name(s) {unknown}; the plan's outputs are {self._outputs}")
        return names  # type: ignore[return-value]


def _arg(name: str, t: TensorType) -> NodeArg:
    return NodeArg(name, list(t.shape), f"tensor({_ONNX_TYPE[t.dtype]})")
