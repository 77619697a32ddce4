"""The values a model's integer inputs may take, for random test inputs (``tilefuse run
--random``): token ids drawn from {0, 1} test nothing, ids past the vocabulary are wrong.

An input's range comes from what the model says, first to last:

1. its ``metadata_props`` entry ``tilefuse.input_ranges`` (JSON ``{input: [low, high]}``,
   half-open; the model zoo writes it);
2. its uses: an input that is (through value-preserving ops such as Cast, Reshape or
   Unsqueeze) the indices of a Gather, GatherElements, GatherND, ScatterElements or
   ScatterND indexes the data's dims, so it takes [0, that dim) (the smallest over its uses);
3. its name: an input named like a mask (``attention_mask``) takes {0, 1};
4. else ``DEFAULT_INT_RANGE``.
"""
from __future__ import annotations

import json
from typing import Mapping

import onnx

from tilefuse.frontend.loader import without_weights
from tilefuse.frontend.shapes import fixed_size, runtime_inputs
from tilefuse.ir.types import TensorType

Range = tuple[int, int]  # half-open [low, high)

DEFAULT_INT_RANGE: Range = (0, 100)  # integers nothing in the model bounds
MASK_RANGE: Range = (0, 2)
META_RANGES = "tilefuse.input_ranges"

# Ops whose output holds exactly the values of their first input, rearranged or retyped.
_SAME_VALUES = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand", "Transpose"}
# op -> (data input, indices input): the indices address the data's dims at ``axis``
_AXIS_INDEXED = {"Gather": (0, 1), "GatherElements": (0, 1), "ScatterElements": (0, 1)}
# op -> (data input, indices input): the indices' last dim addresses the data's leading dims
_LEADING_INDEXED = {"GatherND": (0, 1), "ScatterND": (0, 1)}


def integer_ranges(model: onnx.ModelProto, input_types: Mapping[str, TensorType]) -> dict[str, Range]:
    """The range of every integer input among ``input_types`` (name -> bound type)."""
    ints = [name for name, t in input_types.items() if t.dtype.is_int]
    recorded = _recorded(model)
    found = _index_ranges(model, input_types, set(ints))
    out = {}
    for name in ints:
        if name in recorded:
            out[name] = recorded[name]
        elif name in found:
            out[name] = found[name]
        elif "mask" in name.lower():
            out[name] = MASK_RANGE
        else:
            out[name] = DEFAULT_INT_RANGE
    return out


def _recorded(model: onnx.ModelProto) -> dict[str, Range]:
    text = next((p.value for p in model.metadata_props if p.key == META_RANGES), "")
    try:
        data = json.loads(text) if text else {}
    except ValueError:
        return {}  # a malformed note is no range; the model's uses still bound the input
    out = {}
    for name, r in data.items() if isinstance(data, dict) else ():
        if isinstance(r, list) and len(r) == 2 and all(isinstance(v, int) for v in r) and r[0] < r[1]:
            out[name] = (r[0], r[1])
    return out


def _index_ranges(model: onnx.ModelProto, input_types: Mapping[str, TensorType], ints: set[str]) -> dict[str, Range]:
    """[0, n) for each of ``ints`` that indexes data of n rows (the smallest n over its uses)."""
    origin = {name: name for name in ints}  # value -> the integer input it holds the values of
    dims = _Dims(model, input_types)
    out: dict[str, Range] = {}
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type in _SAME_VALUES and node.input and node.input[0] in origin:
            origin[node.output[0]] = origin[node.input[0]]
            continue
        rows = None
        if node.op_type in _AXIS_INDEXED:
            data, idx = _AXIS_INDEXED[node.op_type]
            if len(node.input) > idx and node.input[idx] in origin:
                shape = dims.of(node.input[data])
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                if shape and -len(shape) <= axis < len(shape):
                    rows = shape[axis]
        elif node.op_type in _LEADING_INDEXED:
            data, idx = _LEADING_INDEXED[node.op_type]
            if len(node.input) > idx and node.input[idx] in origin:
                shape, index_shape = dims.of(node.input[data]), dims.of(node.input[idx])
                batch = next((a.i for a in node.attribute if a.name == "batch_dims"), 0)
                if shape and index_shape and 0 < index_shape[-1] <= len(shape) - batch:
                    rows = min(shape[batch:batch + index_shape[-1]])
        if rows:  # 0 rows: no index is valid, the model fails on any input; leave the default
            name = origin[node.input[1]]
            out[name] = (0, min(rows, out.get(name, (0, rows))[1]))
    return out


class _Dims:
    """Static shapes of the model's values: initializers and inputs as declared, the rest
    from onnx's shape inference with the inputs bound (run once, when first needed)."""

    def __init__(self, model: onnx.ModelProto, input_types: Mapping[str, TensorType]) -> None:
        self.model = model
        self.input_types = input_types
        self.known: dict[str, tuple[int, ...]] = {t.name: tuple(t.dims) for t in model.graph.initializer}
        self.known.update({name: t.shape for name, t in input_types.items()})
        self.inferred: dict[str, tuple[int, ...]] | None = None

    def of(self, name: str) -> tuple[int, ...] | None:
        if name in self.known:
            return self.known[name]
        if self.inferred is None:
            self.inferred = self._infer()
        return self.inferred.get(name)

    def _infer(self) -> dict[str, tuple[int, ...]]:
        bound = {vi.name: self.input_types[vi.name] for vi in runtime_inputs(self.model) if vi.name in self.input_types}
        try:
            inferred = onnx.shape_inference.infer_shapes(without_weights(self.model, bound), data_prop=True)
        except Exception:  # onnx's inference fails on some valid models; then no range is known
            return {}
        out: dict[str, tuple[int, ...]] = {}
        for vi in inferred.graph.value_info:
            sizes = [fixed_size(d) for d in vi.type.tensor_type.shape.dim]
            shape = tuple(d for d in sizes if d is not None)
            if vi.type.tensor_type.HasField("shape") and len(shape) == len(sizes):
                out[vi.name] = shape
        return out
