"""Quantized models as users make them: a float zoo model through onnxruntime's
``quantize_static`` in QDQ form.

That is the usual way an ONNX model becomes int8: export in float, calibrate on sample
inputs, and let the quantizer put QuantizeLinear/DequantizeLinear pairs around the ops it
can quantize (uint8 activations with a zero point, int8 weights without one, per-tensor
scales: the tool's defaults, which its CPU kernels are built for). Calibration feeds are
drawn from a seeded generator, so the same config gives the same scales and the same file.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import onnx

from .catalog import TRANSFORMERS
from .inputs import random_inputs

# calibration batches fed to the quantizer (MinMax): enough to cover the activations' range
CALIBRATION_BATCHES = 4


def build(name: str, config: str, dtype: str) -> onnx.ModelProto:
    """``name`` (a transformer of the zoo, its dynamo export) quantized statically to QDQ."""
    if dtype != "float32":  # the spec allows only float32; a direct call is told the same
        raise ValueError(f"{name}-qdq is quantized from a float32 model, not {dtype}")
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from .transformers_zoo import build_dynamo

    model = build_dynamo(name, config, "float32")
    cfg = TRANSFORMERS[name][config]
    shapes = {"input_ids": (cfg["batch"], cfg["seq"]), "attention_mask": (cfg["batch"], cfg["seq"])}
    ranges = {"input_ids": (0, cfg["vocab_size"])}

    class Batches(CalibrationDataReader):
        def __init__(self) -> None:
            self._feeds = iter([random_inputs(model, shapes, seed=s, ranges=ranges) for s in range(CALIBRATION_BATCHES)])

        def get_next(self):  # type: ignore[override]
            return next(self._feeds, None)

    with tempfile.TemporaryDirectory() as d:
        src, dst = Path(d) / "float.onnx", Path(d) / "qdq.onnx"
        onnx.save(model, src)
        root, level = logging.getLogger(), logging.getLogger().level
        root.setLevel(logging.ERROR)  # the quantizer logs its advice on the root logger
        try:
            quantize_static(str(src), str(dst), Batches(), quant_format=QuantFormat.QDQ,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        finally:
            root.setLevel(level)
        out = onnx.load(dst)
    return out
