"""Loading an ONNX model safely: parse, external data, checker, opset conversion."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import external_data_helper, version_converter

from tilefuse.errors import ModelLoadError

# Models older than this are converted upward first; converters start here.
MIN_OPSET = 13


def load_model(model: str | os.PathLike[str] | bytes | onnx.ModelProto) -> onnx.ModelProto:
    """Parse a model (path, bytes or proto) and load its external data.

    External data must live inside the model's folder: a location that escapes it
    (``../secret``, an absolute path, a symlink out) is refused.
    """
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, bytes):
        return _parse(model, "<bytes>")
    path = Path(model)
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such file")
    proto = _parse(path.read_bytes(), str(path))
    base = path.resolve().parent
    for tensor in external_data_helper._get_all_tensors(proto):
        if external_data_helper.uses_external_data(tensor):
            info = external_data_helper.ExternalDataInfo(tensor)
            target = (base / info.location).resolve()
            if not target.is_relative_to(base):
                raise ModelLoadError(
                    f"{path}: external data {info.location!r} of tensor {tensor.name!r} is outside the model's folder"
                )
            if not target.is_file():
                raise ModelLoadError(f"{path}: external data file {info.location!r} is missing")
    try:
        external_data_helper.load_external_data_for_model(proto, str(base))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: cannot load external data: {e}") from None
    return proto


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise ModelLoadError(f"{where}: not a readable ONNX model (truncated or corrupt?): {e}") from None
    if not proto.graph.node and not proto.graph.output:
        raise ModelLoadError(f"{where}: not an ONNX model (no graph)")
    return proto


def onnx_opset(model: onnx.ModelProto) -> int:
    for op in model.opset_import:
        if op.domain in ("", "ai.onnx"):
            return op.version
    return 0


def check_model(model: onnx.ModelProto) -> None:
    """The onnx checker on the model's structure. Large weights are left out (their data
    is checked as it is read), so checking does not serialise hundreds of megabytes."""
    try:
        onnx.checker.check_model(without_weights(model))
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "invalid"
        raise ModelLoadError(f"model {model.graph.name!r} is not valid ONNX: {first}") from None


def upgrade_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """Convert models below MIN_OPSET upward with onnx's version converter."""
    opset = onnx_opset(model)
    newest = onnx.defs.onnx_opset_version()
    if opset > newest:
        raise ModelLoadError(f"model uses opset {opset}; the installed onnx knows up to {newest}")
    if opset >= MIN_OPSET or opset == 0:
        return model
    model = _pin_old_hardmax(model)
    old_resizes = {n.output[0] for n in model.graph.node if n.op_type in ("Upsample", "Resize") and n.domain in ("", "ai.onnx")}
    try:
        upgraded = version_converter.convert_version(model, MIN_OPSET)
    except Exception as e:  # the converter raises bare RuntimeErrors from C++
        raise ModelLoadError(f"cannot convert the model from opset {opset} to {MIN_OPSET}: {e}") from None
    _pin_old_resize_modes(upgraded, old_resizes)
    return upgraded


def _pin_old_resize_modes(model: onnx.ModelProto, outputs: set[str]) -> None:
    """Upsample and Resize before opset 11 sampled at ``asymmetric`` coordinates with
    ``floor`` rounding; the version converter drops that, leaving the opset-11
    defaults (half_pixel, round_prefer_floor). Put the old meaning back."""
    for node in model.graph.node:
        if node.op_type != "Resize" or node.output[0] not in outputs:
            continue
        given = {a.name for a in node.attribute}
        if "coordinate_transformation_mode" not in given:
            node.attribute.append(onnx.helper.make_attribute("coordinate_transformation_mode", "asymmetric"))
        if "nearest_mode" not in given:
            node.attribute.append(onnx.helper.make_attribute("nearest_mode", "floor"))


def _pin_old_hardmax(model: onnx.ModelProto) -> onnx.ModelProto:
    """Before opset 13, Hardmax flattened its input to 2-D at ``axis``; the version
    converter keeps the axis but not that meaning. Spell the old meaning out
    (Flatten, Hardmax on the last axis, Reshape back) so the upgrade preserves it."""
    if not any(n.op_type == "Hardmax" and n.domain in ("", "ai.onnx") for n in model.graph.node):
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = []
    for i, n in enumerate(out.graph.node):
        if n.op_type != "Hardmax" or n.domain not in ("", "ai.onnx"):
            nodes.append(n)
            continue
        axis = next((a.i for a in n.attribute if a.name == "axis"), 1)
        x, y, tag = n.input[0], n.output[0], f"__tilefuse_hardmax{i}"
        nodes += [
            onnx.helper.make_node("Flatten", [x], [f"{tag}_flat"], axis=axis),
            onnx.helper.make_node("Hardmax", [f"{tag}_flat"], [f"{tag}_max"], axis=1, name=n.name),
            onnx.helper.make_node("Shape", [x], [f"{tag}_shape"]),
            onnx.helper.make_node("Reshape", [f"{tag}_max", f"{tag}_shape"], [y]),
        ]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def without_weights(proto: onnx.ModelProto, input_types: Mapping[str, object] | None = None) -> onnx.ModelProto:
    """The model with bound input shapes and its large initializers turned into typed
    inputs: shape inference needs their shapes, not their values, and serialising
    hundreds of megabytes of weights for it would cost seconds."""
    m = onnx.ModelProto()
    m.ir_version = proto.ir_version
    m.opset_import.extend(proto.opset_import)
    g = m.graph
    g.name = proto.graph.name
    g.node.extend(proto.graph.node)
    g.output.extend(proto.graph.output)
    inits = {t.name for t in proto.graph.initializer}
    for vi in proto.graph.input:
        if vi.name in inits:
            continue
        t = (input_types or {}).get(vi.name)
        new = g.input.add()
        new.CopyFrom(vi)
        if t is not None:
            dims = new.type.tensor_type.shape.dim
            del dims[:]
            for d in t.shape:  # type: ignore[attr-defined]
                dims.add().dim_value = d
    for init in proto.graph.initializer:
        if int(np.prod(init.dims)) <= 4096:  # shape-like constants: inference may need values
            g.initializer.append(init)
        else:
            g.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return m
