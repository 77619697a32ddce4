"""torch -> ONNX for the zoo's torch-built models, and the check that the result is right.

Two exporters are used on purpose, because real models come from both:

- ``export_dynamo``: ``torch.onnx.export(dynamo=True)``, the default since torch 2.9.
  Opset 20, fused ``LayerNormalization`` and ``Gelu`` ops, few shape ops.
- ``export_torchscript``: the older tracing exporter. At opset 14 it spells LayerNorm as
  ReduceMean/Sub/Pow/Sqrt/Div, GELU with Erf and shapes with Shape/Gather/Concat/
  Unsqueeze, which is what most ONNX models in the wild still look like.

Every builder checks its model against the torch module it came from
(``assert_matches_torch``), so a zoo model is known to compute what torch computes.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from .spec import META_ERROR, set_metadata

DYNAMO_OPSET = 20  # torch 2.13's default; pinned so a torch upgrade does not change the zoo
LEGACY_OPSET = 14  # the last opset before LayerNormalization (17) for the legacy variants
CNN_OPSET = 17

# The exporters' chatter (deprecation notices, tracer warnings, torchvision not found,
# progress lines) says nothing about the models, which are checked numerically instead.
_NOISY_LOGGERS = ("torch.onnx", "torch._dynamo", "torch.export", "torch._export",
                  "onnxscript", "torch.fx.experimental.symbolic_shapes")


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence warnings and exporter logging for the duration of an export."""
    loggers = [logging.getLogger(n) for n in _NOISY_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def export_dynamo(module: torch.nn.Module, args: tuple[torch.Tensor, ...],
                  input_names: Sequence[str], output_names: Sequence[str],
                  dynamic_shapes: tuple[Mapping[int, Any] | None, ...],
                  opset: int = DYNAMO_OPSET) -> onnx.ModelProto:
    """Export with the torch.export-based exporter (optimised), weights inline.

    ``dynamic_shapes`` follows ``module.forward``'s positional parameters, one
    ``{axis: torch.export.Dim}`` per tensor.
    """
    with quiet(), torch.no_grad():
        program = torch.onnx.export(
            module, args, dynamo=True, opset_version=opset, verbose=False,
            input_names=list(input_names), output_names=list(output_names),
            dynamic_shapes=dynamic_shapes, optimize=True,
        )
        # model_proto serialises the initializers into the proto itself, so the caller
        # saves one self-contained file rather than program.save()'s external data.
        return program.model_proto


def export_torchscript(module: torch.nn.Module, args: tuple[torch.Tensor, ...],
                       input_names: Sequence[str], output_names: Sequence[str],
                       dynamic_axes: Mapping[str, Mapping[int, str]], opset: int,
                       keep_batchnorm: bool = False) -> onnx.ModelProto:
    """Export with the TorchScript tracing exporter (``dynamo=False``).

    With ``keep_batchnorm`` the export does not fold eval-mode BatchNorm into the
    preceding Conv (TrainingMode.PRESERVE on an eval module): real CNN exports keep
    their BatchNormalization nodes, and folding them is the compiler's job.
    """
    training = torch.onnx.TrainingMode.PRESERVE if keep_batchnorm else torch.onnx.TrainingMode.EVAL
    with quiet(), torch.no_grad(), tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        torch.onnx.export(
            module, args, str(path), dynamo=False, opset_version=opset,
            input_names=list(input_names), output_names=list(output_names),
            dynamic_axes={k: dict(v) for k, v in dynamic_axes.items()}, training=training,
        )
        return onnx.load(str(path))


def run_ort(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Run ``model`` once in onnxruntime on the CPU provider, warnings silenced."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, dict(feeds))


def assert_matches_torch(model: onnx.ModelProto, module: torch.nn.Module,
                         args: tuple[torch.Tensor, ...], input_names: Sequence[str],
                         rtol: float) -> float:
    """Run ``model`` in onnxruntime and ``module`` in torch on ``args``; return the
    largest error relative to each output's scale, raising if it exceeds ``rtol``."""
    with torch.no_grad():
        expected = module(*args)
    if isinstance(expected, torch.Tensor):
        expected = (expected,)
    got = run_ort(model, {n: a.numpy() for n, a in zip(input_names, args)})
    if len(got) != len(expected):
        raise AssertionError(f"onnx gives {len(got)} outputs, torch {len(expected)}")
    worst = 0.0
    for i, (g, e) in enumerate(zip(got, expected)):
        e = e.float().numpy()
        if g.shape != e.shape:
            raise AssertionError(f"output {i}: onnx shape {g.shape}, torch {e.shape}")
        scale = max(float(np.abs(e).max()), 1e-6)
        err = float(np.abs(g.astype(np.float32) - e).max()) / scale
        if not err <= rtol:  # also catches NaN
            raise AssertionError(f"output {i}: error {err:.3g} of scale {scale:.3g} > {rtol}")
        worst = max(worst, err)
    return worst


def export_checked(module: torch.nn.Module, args: tuple[torch.Tensor, ...],
                   input_names: Sequence[str], output_names: Sequence[str],
                   dynamic_axes: Mapping[str, Mapping[int, str]], opset: int, dtype: str,
                   keep_batchnorm: bool = False) -> onnx.ModelProto:
    """``export_torchscript``, then ``assert_matches_torch`` at ``dtype``'s tolerance; the
    error found is recorded in the model's metadata."""
    model = export_torchscript(module, args, input_names, output_names, dynamic_axes, opset,
                               keep_batchnorm=keep_batchnorm)
    error = assert_matches_torch(model, module, args, input_names, tolerance(dtype))
    set_metadata(model, {META_ERROR: f"{error:.3g}"})
    return model


def torch_dtype(dtype: str) -> torch.dtype:
    return {"float32": torch.float32, "float16": torch.float16}[dtype]


def tolerance(dtype: str) -> float:
    """Error allowed against torch, relative to an output's largest magnitude.

    fp16 is compared with torch's own fp16 CPU run, whose accumulation order differs.
    """
    return {"float32": 1e-4, "float16": 2e-2}[dtype]
