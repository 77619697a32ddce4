"""What a converter sees of one ONNX node: its inputs as IR values, its attributes
with the spec's defaults, and the builder to emit primitives into."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tilefuse.errors import ConversionError, UnsupportedOp, UnsupportedOpError
from tilefuse.ir.builder import Builder
from tilefuse.ir.dtypes import DType
from tilefuse.ir.graph import Value

if TYPE_CHECKING:
    from tilefuse.frontend.scope import Scope

# ONNX TensorProto element types tilefuse supports.
ONNX_DTYPES: dict[int, DType] = {
    onnx.TensorProto.FLOAT: DType.FLOAT32,
    onnx.TensorProto.FLOAT16: DType.FLOAT16,
    onnx.TensorProto.BFLOAT16: DType.BFLOAT16,
    onnx.TensorProto.DOUBLE: DType.FLOAT64,
    onnx.TensorProto.INT8: DType.INT8,
    onnx.TensorProto.INT16: DType.INT16,
    onnx.TensorProto.INT32: DType.INT32,
    onnx.TensorProto.INT64: DType.INT64,
    onnx.TensorProto.UINT8: DType.UINT8,
    onnx.TensorProto.UINT16: DType.UINT16,
    onnx.TensorProto.UINT32: DType.UINT32,
    onnx.TensorProto.UINT64: DType.UINT64,
    onnx.TensorProto.BOOL: DType.BOOL,
}
TO_ONNX_DTYPE = {v: k for k, v in ONNX_DTYPES.items()}


def onnx_dtype(elem_type: int, what: str) -> DType:
    try:
        return ONNX_DTYPES[elem_type]
    except KeyError:
        name = onnx.TensorProto.DataType.Name(elem_type) if elem_type in onnx.TensorProto.DataType.values() else elem_type
        raise ConversionError(f"{what}: element type {name} is not supported") from None


def tensor_to_array(t: onnx.TensorProto) -> np.ndarray:
    """An initializer's data as a numpy array of its tilefuse dtype."""
    onnx_dtype(t.data_type, f"initializer {t.name!r}")
    array = numpy_helper.to_array(t)
    if t.data_type == onnx.TensorProto.BFLOAT16 and array.dtype != DType.BFLOAT16.numpy:
        array = array.view(DType.BFLOAT16.numpy) if array.dtype.itemsize == 2 else array.astype(DType.BFLOAT16.numpy)
    return array


class NotConstantError(ConversionError):
    """A node needs a compile-time constant where the model computes a value at run time.

    ``graph_inputs`` names the graph inputs that value depends on, so a caller can bind
    them (``import_onnx(..., constants=...)``); ``node`` is the label of the node that
    needs it (export-ort leaves just that node to onnxruntime).
    """

    def __init__(self, message: str, graph_inputs: list[str], node: str = "") -> None:
        super().__init__(message)
        self.graph_inputs = graph_inputs
        self.node = node


class NodeContext:
    def __init__(self, b: Builder, node: onnx.NodeProto, inputs: list[Value | None], opset: int, label: str,
                 *, scope: "Scope | None" = None, opsets: Mapping[str, int] | None = None) -> None:
        self.b = b
        self.node = node
        self.inputs = inputs
        self.opset = opset
        self.label = label  # the node's name, or op_type#index when it has none
        self.scope = scope  # the values in scope, for converters of ops with subgraphs (If)
        self.opsets = dict(opsets or {})  # the model's opset per domain, for converting subgraphs
        self._attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        self._schema: onnx.defs.OpSchema | None
        try:
            self._schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
        except onnx.defs.SchemaError:
            self._schema = None

    @property
    def op_type(self) -> str:
        return self.node.op_type

    # -- inputs ---------------------------------------------------------------------
    def input(self, i: int) -> Value:
        v = self.optional_input(i)
        if v is None:
            raise ConversionError(f"{self.op_type} node {self.label!r}: input {i} is required")
        return v

    def optional_input(self, i: int) -> Value | None:
        return self.inputs[i] if i < len(self.inputs) else None

    def const_input(self, i: int) -> np.ndarray:
        """Input ``i`` as a compile-time constant array."""
        v = self.input(i)
        if v.data is None:
            deps = graph_inputs_behind(v)
            name = self.node.input[i]
            raise NotConstantError(
                f"{self.op_type} node {self.label!r}: input {i} ({name!r}) must be known at compile "
                f"time, but it depends on graph input(s) {deps}; bind them with constants=...",
                deps,
                self.label,
            )
        return v.data

    def optional_const_input(self, i: int) -> np.ndarray | None:
        return None if self.optional_input(i) is None else self.const_input(i)

    # -- attributes -----------------------------------------------------------------
    def attr(self, name: str, default: Any = None) -> Any:
        """The attribute's value; else the spec's default; else ``default``."""
        if name in self._attrs:
            value = self._attrs[name]
            return value.decode() if isinstance(value, bytes) else value
        if self._schema is not None and name in self._schema.attributes:
            proto = self._schema.attributes[name].default_value
            if proto.type != onnx.AttributeProto.UNDEFINED:
                value = helper.get_attribute_value(proto)
                return value.decode() if isinstance(value, bytes) else value
        return default

    def has_attr(self, name: str) -> bool:
        return name in self._attrs

    # -- errors ---------------------------------------------------------------------
    def unsupported(self, reason: str) -> UnsupportedOpError:
        return UnsupportedOpError([UnsupportedOp(self.node.domain, self.op_type, self.opset, (self.label,), reason)])

    def error(self, message: str) -> ConversionError:
        return ConversionError(f"{self.op_type} node {self.label!r}: {message}")


def graph_inputs_behind(v: Value) -> list[str]:
    """The graph inputs (not constants) that ``v`` is computed from, sorted."""
    seen: set[int] = set()
    found: list[str] = []
    stack = [v]
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if x.producer is None:
            if not x.is_constant:
                found.append(x.name)
        else:
            stack.extend(x.producer.inputs)
    return sorted(found)
