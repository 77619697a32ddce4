"""ONNX -> Graph: the frontend pipeline as one readable function."""
from __future__ import annotations

import os
import warnings
from typing import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from tilefuse.errors import ConversionError, ModelLoadError, ShapeError, TilefuseError
from tilefuse.frontend import registry
from tilefuse.frontend.context import NodeContext, onnx_dtype
from tilefuse.frontend.coverage import check_supported, opsets_of
from tilefuse.frontend.loader import check_model, load_model, onnx_opset, upgrade_opset, without_weights
from tilefuse.frontend.shapes import ShapeSpec, bind_input_types, fixed_size, runtime_inputs
from tilefuse.ir.builder import Builder
from tilefuse.ir.dtypes import DType
from tilefuse.ir.graph import Graph, Value
from tilefuse.ir.verify import verify_graph

class ShapeMismatchWarning(UserWarning):
    """onnx's shape inference disagrees with tilefuse's on a graph output."""


ModelLike = str | os.PathLike[str] | bytes | onnx.ModelProto


def import_onnx(
    model: ModelLike,
    shapes: ShapeSpec | None = None,
    *,
    constants: Mapping[str, np.ndarray] | None = None,
    check_shapes: bool = True,
    external_data_dir: str | os.PathLike[str] | None = None,
) -> Graph:
    """Load an ONNX model as a verified tilefuse Graph with static shapes.

    ``shapes`` binds dynamic dims (by input name or by dim symbol). ``constants``
    freezes graph inputs to values known at compile time. ``external_data_dir`` is the
    folder external weights are read from (default: the model file's; a model given as
    bytes or a ModelProto with external data needs it). Raises ModelLoadError,
    UnsupportedOpError (listing every unsupported op), ShapeError, InputError or
    ConversionError.
    """
    proto = load_model(model, external_data_dir)
    check_model(proto)
    check_supported(proto, any_opset=True)  # first: the version converter trips on unknown ops
    proto = upgrade_opset(proto)
    check_supported(proto)
    input_types = bind_input_types(proto, shapes)
    graph = convert_graph(proto, input_types, dict(constants or {}))
    graph.remove_dead_nodes()
    verify_graph(graph)
    if check_shapes:
        _cross_check_outputs(proto, graph, input_types)
    return graph


def convert_graph(
    proto: onnx.ModelProto, input_types: Mapping[str, "object"], constants: dict[str, np.ndarray]
) -> Graph:
    b = Builder(proto.graph.name or "model")
    b.graph.opset = onnx_opset(proto)
    env: dict[str, Value] = {}
    for init in proto.graph.initializer:
        try:
            array = _tensor_to_array(init)
        except (ValueError, TypeError) as e:
            raise ModelLoadError(f"initializer {init.name!r} is corrupt: {e}") from None
        env[init.name] = b.const(array, name=init.name)
    for vi in runtime_inputs(proto):
        t = input_types[vi.name]
        if vi.name in constants:
            array = np.asarray(constants[vi.name])
            if array.dtype != t.dtype.numpy:  # type: ignore[attr-defined]
                raise ShapeError(f"constant for input {vi.name!r} has dtype {array.dtype}, expected {t.dtype}")  # type: ignore[attr-defined]
            env[vi.name] = b.const(array, name=vi.name)
        else:
            env[vi.name] = b.input(vi.name, t)  # type: ignore[arg-type]
    opsets = opsets_of(proto)
    for i, node in enumerate(proto.graph.node):
        label = node.name or f"{node.op_type}#{i}"
        domain = "" if node.domain == "ai.onnx" else node.domain
        entry = registry.lookup(domain, node.op_type, opsets.get(domain, 0))
        assert entry is not None, "coverage was checked before conversion"
        inputs = [env[name] if name else None for name in node.input]
        b.origin = label
        ctx = NodeContext(b, node, inputs, opsets.get(domain, 0), label)
        try:
            result = entry.fn(ctx)
        except TilefuseError:
            raise
        except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError) as e:
            raise ConversionError(f"{node.op_type} node {label!r}: {e}") from e
        outputs = [result] if isinstance(result, Value) else list(result)
        if len(outputs) < len([o for o in node.output if o]):
            raise ConversionError(f"{node.op_type} node {label!r}: produced {len(outputs)} outputs, needs {len(node.output)}")
        for name, v in zip(node.output, outputs):
            if name and v is not None:
                _adopt_name(b, v, name, label)
                env[name] = v
    for out in proto.graph.output:
        if out.name not in env:
            raise ConversionError(f"graph output {out.name!r} is never computed")
        v = env[out.name]
        declared = out.type.tensor_type.elem_type
        if declared and onnx_dtype(declared, f"output {out.name!r}") is not v.type.dtype:
            raise ConversionError(f"output {out.name!r}: declared {onnx_dtype(declared, out.name)}, computed {v.type.dtype}")
        b.output(out.name, v)
    return b.graph


def _adopt_name(b: Builder, v: Value, name: str, label: str) -> None:
    """Give a value made by this node its ONNX name, for readable graphs and errors."""
    if v.producer is not None and v.producer.origin == label and "/" in v.name:
        v.name = b.unique(name)
    elif v.is_constant and v.name.startswith(("const", "/")):
        v.name = b.unique(name)


def _tensor_to_array(t: onnx.TensorProto) -> np.ndarray:
    onnx_dtype(t.data_type, f"initializer {t.name!r}")
    array = numpy_helper.to_array(t)
    if t.data_type == onnx.TensorProto.BFLOAT16 and array.dtype != DType.BFLOAT16.numpy:
        array = array.view(DType.BFLOAT16.numpy) if array.dtype.itemsize == 2 else array.astype(DType.BFLOAT16.numpy)
    return array


def _cross_check_outputs(proto: onnx.ModelProto, graph: Graph, input_types: Mapping[str, object]) -> None:
    """Compare our output shapes with onnx's shape inference where it knows them."""
    bound = without_weights(proto, input_types)
    try:
        inferred = onnx.shape_inference.infer_shapes(bound, strict_mode=False, data_prop=True)
    except Exception:  # onnx's inference is a cross-check only; it fails on some valid models
        return
    for vi in inferred.graph.output:
        shape = vi.type.tensor_type.shape
        if not vi.type.tensor_type.HasField("shape") or vi.name not in graph.outputs:
            continue
        if all(fixed_size(d) is not None for d in shape.dim):  # -1: a dynamic dim, as onnxruntime reads it
            theirs = tuple(d.dim_value for d in shape.dim)
            ours = graph.outputs[vi.name].type.shape
            if theirs != ours:
                # onnx's inference has known gaps (ceil-mode pooling ignores the rule that
                # the last window starts inside the input); ours is tested against
                # onnxruntime, so a disagreement is worth a warning, not a refusal.
                warnings.warn(
                    f"output {vi.name!r}: tilefuse infers shape {list(ours)}, onnx's shape inference {list(theirs)}",
                    ShapeMismatchWarning,
                    stacklevel=3,
                )
