"""Random inputs for any ONNX model, with valid values for zoo models.

A zoo model records its default input shapes and the valid ranges of its integer
inputs in ``metadata_props`` (see ``spec.META_SHAPES``/``META_RANGES``), so
``random_inputs(path, seed=0)`` needs nothing else. For other models, pass the shapes
of any input with symbolic dimensions, and ``ranges`` for integer inputs that index
something.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from .spec import META_RANGES, META_SHAPES, Shape, get_metadata

# Integer inputs without a recorded range get values in [0, 2): valid for any index or
# id input of a non-empty dimension, and for booleans stored as ints.
DEFAULT_INT_RANGE = (0, 2)


def random_inputs(path_or_model: str | Path | onnx.ModelProto,
                  shapes: Mapping[str, Shape] | None = None, seed: int = 0,
                  ranges: Mapping[str, tuple[int, int]] | None = None) -> dict[str, np.ndarray]:
    """Fresh random feeds for every graph input (initializers excluded).

    Shapes: ``shapes[name]`` if given; else, where ``shapes`` binds every symbolic dimension
    of the input by name (``{"batch": 32, "seq": 128}``), the input's dims with those
    values; else the model's recorded shape, else its static shape; a symbolic dimension
    left unbound raises ``ValueError``. Values: floats are
    normal(0, 1) in the input's dtype; integers uniform in ``ranges[name]`` (else the
    recorded range, else ``DEFAULT_INT_RANGE``), half-open; bools fair coin flips.
    An input named ``attention_mask`` is a padding mask: ones, with the last quarter of
    the last row zero, never all zeros. Same model, shapes and seed give the same arrays.
    """
    model = path_or_model if isinstance(path_or_model, onnx.ModelProto) else \
        onnx.load(str(path_or_model), load_external_data=False)
    meta = get_metadata(model)
    recorded_shapes = json.loads(meta.get(META_SHAPES, "{}"))
    recorded_ranges = json.loads(meta.get(META_RANGES, "{}"))
    given = dict(shapes or {})
    dims = {k: v for k, v in given.items() if isinstance(v, int)}  # symbolic dims by name
    ranges = {**recorded_ranges, **(ranges or {})}
    rng = np.random.default_rng(seed)

    initializers = {t.name for t in model.graph.initializer}
    feeds: dict[str, np.ndarray] = {}
    for vi in model.graph.input:
        if vi.name in initializers:
            continue
        tensor_type = vi.type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        bound = _bound_shape(vi, dims)
        if vi.name in given and not isinstance(given[vi.name], int):
            shape = tuple(given[vi.name])
        elif bound is not None:
            shape = bound
        elif vi.name in recorded_shapes:
            shape = tuple(recorded_shapes[vi.name])
        else:
            shape = static_shape(vi)
        feeds[vi.name] = random_array(vi.name, dtype, shape, rng, ranges.get(vi.name))
    return feeds


def _bound_shape(vi: onnx.ValueInfoProto, dims: Mapping[str, int]) -> Shape | None:
    """The input's shape with its symbolic dims taken from ``dims``; None if it has none
    or one is not bound there."""
    out, symbolic = [], False
    for d in vi.type.tensor_type.shape.dim:
        if d.HasField("dim_value") and d.dim_value >= 0:  # -1: dynamic, as onnxruntime reads it
            out.append(d.dim_value)
        elif d.dim_param in dims:
            out.append(dims[d.dim_param])
            symbolic = True
        else:
            return None
    return tuple(out) if symbolic else None


def static_shape(vi: onnx.ValueInfoProto) -> Shape:
    dims = []
    for d in vi.type.tensor_type.shape.dim:
        if not d.HasField("dim_value") or d.dim_value < 0:
            raise ValueError(f"input {vi.name!r}: dimension {d.dim_param or '?'} is symbolic;"
                             " pass its shape in `shapes`")
        dims.append(d.dim_value)
    return tuple(dims)


def random_array(name: str, dtype: np.dtype, shape: Shape, rng: np.random.Generator,
                 value_range: tuple[int, int] | None) -> np.ndarray:
    if name == "attention_mask":
        return padding_mask(shape, dtype)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        low, high = value_range or DEFAULT_INT_RANGE
        return rng.integers(low, high, size=shape, dtype=dtype)
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    raise ValueError(f"input {name!r}: no random values for dtype {dtype}")


def padding_mask(shape: Shape, dtype: np.dtype) -> np.ndarray:
    """Ones, with the last quarter of the last row zeroed (a right-padded sequence)."""
    mask = np.ones(shape, dtype=dtype)
    if len(shape) == 2 and shape[1] >= 4:
        mask[-1, shape[1] - shape[1] // 4:] = 0
    return mask
