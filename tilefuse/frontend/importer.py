"""ONNX -> Graph: the frontend pipeline as one readable function."""
from __future__ import annotations

import os
import warnings
from typing import Mapping

import numpy as np
import onnx

from tilefuse.errors import ConversionError, ModelLoadError, ShapeError
from tilefuse.frontend.context import onnx_dtype, tensor_to_array
from tilefuse.frontend.coverage import check_supported, opsets_of
from tilefuse.frontend import qdq
from tilefuse.frontend.loader import check_model, load_model, onnx_opset, upgrade_opset, without_weights
from tilefuse.frontend.scope import Scope, convert_nodes
from tilefuse.frontend.shapes import (CONSTS_FORM, ConstSpec, ShapeSpec, as_mapping, bind_constants, bind_input_types,
                                     constant_shapes, fixed_size, runtime_inputs)
from tilefuse.ir.builder import Builder
from tilefuse.ir.graph import Graph
from tilefuse.ir.types import TensorType
from tilefuse.ir.verify import verify_graph

class ShapeMismatchWarning(UserWarning):
    """onnx's shape inference disagrees with tilefuse's on a graph output."""


ModelLike = str | os.PathLike[str] | bytes | onnx.ModelProto


def import_onnx(
    model: ModelLike,
    shapes: ShapeSpec | None = None,
    *,
    constants: ConstSpec | None = None,
    check_shapes: bool = True,
    external_data_dir: str | os.PathLike[str] | None = None,
    integer_products: bool = False,
) -> Graph:
    """Load an ONNX model as a verified tilefuse Graph with static shapes.

    ``shapes`` binds dynamic dims (by input name or by dim symbol). ``constants``
    freezes graph inputs to values known at compile time (see ``bind_constants``): they
    are no inputs of the graph, and what depends only on them folds away (an If on them
    keeps the branch taken). ``external_data_dir`` is the folder external weights are read
    from (default: the model file's; a model given as bytes or a ModelProto with external
    data needs it). ``integer_products`` runs quantized (QDQ) products by constant 8-bit
    weights as integer products (``frontend/qdq.py``; a target's
    ``GemmPolicy.integer_products``). Raises ModelLoadError, UnsupportedOpError (listing every unsupported
    op), ShapeError, InputError or ConversionError.
    """
    proto = load_model(model, external_data_dir)
    check_model(proto)
    check_supported(proto, any_opset=True)  # first: the version converter trips on unknown ops
    proto = upgrade_opset(proto)
    check_supported(proto)
    if integer_products:
        proto = qdq.integer_products(proto)
    constants = as_mapping(constants, "consts", CONSTS_FORM)
    input_types = bind_input_types(proto, constant_shapes(proto, shapes, constants))
    graph = convert_graph(proto, input_types, bind_constants(input_types, constants))
    graph.remove_dead_nodes()
    verify_graph(graph)
    if check_shapes:
        _cross_check_outputs(proto, graph, input_types)
    return graph


def convert_graph(
    proto: onnx.ModelProto, input_types: Mapping[str, TensorType], constants: dict[str, np.ndarray]
) -> Graph:
    b = Builder(proto.graph.name or "model")
    b.graph.opset = onnx_opset(proto)
    scope = Scope(b)
    for init in proto.graph.initializer:
        try:
            array = tensor_to_array(init)
        except (ValueError, TypeError) as e:
            raise ModelLoadError(f"initializer {init.name!r} is corrupt: {e}") from None
        scope[init.name] = b.const(array, name=init.name)
    for vi in runtime_inputs(proto):
        t = input_types[vi.name]
        if vi.name in constants:
            array = np.asarray(constants[vi.name])
            if array.dtype != t.dtype.numpy:
                raise ShapeError(f"constant for input {vi.name!r} has dtype {array.dtype}, expected {t.dtype}")
            scope[vi.name] = b.const(array, name=vi.name)
        else:
            scope[vi.name] = b.input(vi.name, t)
    convert_nodes(b, scope, proto.graph.node, opsets_of(proto))
    _check_declared_types(proto, scope)
    for out in proto.graph.output:
        if out.name not in scope:
            raise ConversionError(f"graph output {out.name!r} is never computed")
        v = scope[out.name]
        declared = out.type.tensor_type.elem_type
        if declared and onnx_dtype(declared, f"output {out.name!r}") is not v.type.dtype:
            raise ConversionError(f"output {out.name!r}: declared {onnx_dtype(declared, out.name)}, computed {v.type.dtype}")
        b.output(out.name, v)
    return b.graph


def _check_declared_types(proto: onnx.ModelProto, scope: Scope) -> None:
    """A value_info that declares another element type than the value has makes the model
    invalid (onnxruntime and the full onnx checker refuse it): refuse it too, rather than
    run a model whose author meant something else."""
    for vi in proto.graph.value_info:
        declared = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
        if declared and vi.name in scope:
            want = onnx_dtype(declared, f"value {vi.name!r}")
            got = scope[vi.name].type.dtype
            if want is not got:
                raise ModelLoadError(f"value_info declares {vi.name!r} as {want}, but the node computing it gives {got}")


def _cross_check_outputs(proto: onnx.ModelProto, graph: Graph, input_types: Mapping[str, TensorType]) -> None:
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
