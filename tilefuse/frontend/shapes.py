"""Binding the dynamic dims of a model's inputs to concrete sizes, and inputs to values
known at compile time."""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import onnx

from tilefuse.errors import InputError, ShapeError
from tilefuse.frontend.context import onnx_dtype
from tilefuse.ir.types import TensorType

ShapeSpec = Mapping[str, Sequence[int] | int]
ConstSpec = Mapping[str, object]  # input name -> its value: a number, a nested sequence, an array
SHAPES_FORM = "a dict of input name or dim symbol -> sizes, e.g. {'batch': 1, 'seq': 128}"
CONSTS_FORM = "a dict of input name -> value, e.g. {'sample_rate': 16000}"


def runtime_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that are not initializers (old models list weights as inputs too)."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def bind_input_types(model: onnx.ModelProto, shapes: ShapeSpec | None) -> dict[str, TensorType]:
    """Concrete types for every runtime input.

    ``shapes`` maps an input name to its whole shape, or a symbolic dim name (such as
    ``batch``) to its size. A dynamic dim (a symbol, a dim without a value, or a negative
    value such as ``-1``) left unbound is a ShapeError naming input and dim.
    """
    shapes = as_mapping(shapes, "shapes", SHAPES_FORM)
    inputs = runtime_inputs(model)
    names = {i.name for i in inputs}
    symbols = {d.dim_param for i in inputs for d in i.type.tensor_type.shape.dim if d.dim_param}
    unknown = sorted(k for k in shapes if k not in names and k not in symbols)
    if unknown:
        raise InputError(
            f"the shapes given (shapes= / --shape) name {unknown}, which are neither inputs {sorted(names)} "
            f"nor dim symbols {sorted(symbols)}"
        )
    shapes = {**_implied_symbols(inputs, shapes), **shapes}
    out: dict[str, TensorType] = {}
    for vi in inputs:
        tt = vi.type.tensor_type
        if not vi.type.HasField("tensor_type"):
            raise InputError(f"input {vi.name!r} is not a tensor (sequences and maps are not supported)")
        dtype = onnx_dtype(tt.elem_type, f"input {vi.name!r}")
        dims = list(tt.shape.dim)
        given = shapes.get(vi.name)
        if given is not None:
            given = _given_sizes(f"input {vi.name!r}", given)
            if tt.HasField("shape") and len(given) != len(dims):
                raise ShapeError(f"input {vi.name!r} has rank {len(dims)}, but the shape given is {list(given)}")
            for k, (d, g) in enumerate(zip(dims, given)):
                if fixed_size(d) not in (None, g):
                    raise ShapeError(f"input {vi.name!r} dim {k} is fixed at {d.dim_value}, but {g} was given")
            out[vi.name] = TensorType(dtype, given)
            continue
        if not tt.HasField("shape"):
            raise ShapeError(f"input {vi.name!r} has no shape; give one: shapes={{{vi.name!r}: (D0, D1, ...)}} "
                             f"(CLI: --shape {vi.name}=D0,D1,...)")
        bound = []
        for k, d in enumerate(dims):
            size = fixed_size(d)
            if size is not None:
                bound.append(size)
            elif d.dim_param and d.dim_param in shapes:
                bound.append(_symbol_size(d.dim_param, shapes[d.dim_param]))
            else:
                sym = f" ({d.dim_param!r})" if d.dim_param else f" (declared {d.dim_value})" if d.HasField("dim_value") else ""
                sizes = [str(fixed_size(x)) if fixed_size(x) is not None else "N" for x in dims]
                raise ShapeError(
                    f"input {vi.name!r} dim {k}{sym} is dynamic; bind it, e.g. --shape {vi.name}={','.join(sizes)}"
                    + (f" or --shape {d.dim_param}=N" if d.dim_param else "")
                    + f" (Python: shapes={{{vi.name!r}: ({', '.join(sizes)})}}"
                    + (f" or shapes={{{d.dim_param!r}: N}})" if d.dim_param else ")")
                )
        out[vi.name] = TensorType(dtype, tuple(bound))
    return out


def _implied_symbols(inputs: Sequence[onnx.ValueInfoProto], shapes: ShapeSpec) -> dict[str, int]:
    """The dim symbols a whole input's shape names: ``input_ids=(2, 16)`` on an input
    declared [batch, seq] binds batch=2 and seq=16 for every input that shares them (the
    attention mask too). Two sizes for one symbol, from two inputs or against the symbol's
    own binding, are a ShapeError naming both."""
    implied: dict[str, tuple[int, str]] = {}
    for vi in inputs:
        given = shapes.get(vi.name)
        if given is None:
            continue
        sizes = _given_sizes(f"input {vi.name!r}", given)
        for d, g in zip(vi.type.tensor_type.shape.dim, sizes):
            if not d.dim_param:
                continue
            sym = d.dim_param
            if sym in shapes and _symbol_size(sym, shapes[sym]) != g:
                raise ShapeError(f"input {vi.name!r} given as {list(sizes)} makes {sym!r} {g}, but {sym!r} is given "
                                 f"as {_symbol_size(sym, shapes[sym])}")
            if sym in implied and implied[sym][0] != g:
                raise ShapeError(f"inputs {implied[sym][1]!r} and {vi.name!r} give dim symbol {sym!r} two sizes: "
                                 f"{implied[sym][0]} and {g}")
            implied[sym] = (g, vi.name)
    return {sym: size for sym, (size, _) in implied.items()}


def fixed_size(dim: onnx.TensorShapeProto.Dimension) -> int | None:
    """The size a dim is fixed at, or None when it is dynamic: a symbol, no value at all, or
    a negative value (exporters write ``-1`` for a dynamic dim, and onnxruntime reads every
    negative value as dynamic; ``0`` is a fixed, empty dim, as in onnxruntime)."""
    if dim.HasField("dim_value") and dim.dim_value >= 0:
        return dim.dim_value
    return None


def _given_sizes(what: str, given: Sequence[int] | int) -> tuple[int, ...]:
    dims: tuple[object, ...]
    try:
        dims = (given,) if isinstance(given, int) else tuple(given)
    except TypeError:  # the caller's value need not be what the annotation says
        dims = (given,)
    sizes = [d for d in dims if isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0]
    if len(sizes) != len(dims):
        raise ShapeError(f"the sizes given for {what} must be non-negative integers, got {list(dims)}")
    return tuple(int(d) for d in sizes)


def _symbol_size(symbol: str, given: Sequence[int] | int) -> int:
    dims = _given_sizes(f"dim symbol {symbol!r}", given)
    if len(dims) != 1:
        raise ShapeError(f"dim symbol {symbol!r} takes one size, got {list(dims)}")
    return dims[0]


def as_mapping(given: object, what: str, form: str) -> dict:
    """``given`` (None: empty) as a dict with string keys; ShapeError naming ``what`` and
    the form it takes otherwise (``shapes=5``, ``shapes="batch=2"``)."""
    if given is None:
        return {}
    if not isinstance(given, Mapping) or not all(isinstance(k, str) for k in given):
        shown = repr(given) if len(repr(given)) <= 60 else type(given).__name__
        raise ShapeError(f"{what} must be {form}, got {shown}")
    return dict(given)


def constant_shapes(model: onnx.ModelProto, shapes: ShapeSpec | None, constants: ConstSpec) -> dict[str, Sequence[int] | int]:
    """``shapes`` and, for each input bound to a value whose declared shape is not static
    (and that ``shapes`` does not bind), the value's shape."""
    out = as_mapping(shapes, "shapes", SHAPES_FORM)
    constants = as_mapping(constants, "consts", CONSTS_FORM)
    for vi in runtime_inputs(model):
        if vi.name in constants and vi.name not in out:
            tt = vi.type.tensor_type
            if not tt.HasField("shape") or not all(fixed_size(d) is not None for d in tt.shape.dim):
                out[vi.name] = tuple(np.shape(constants[vi.name]))
    return out


def bind_constants(input_types: Mapping[str, TensorType], constants: ConstSpec) -> dict[str, np.ndarray]:
    """Each bound input's value as an array of exactly the input's dtype and shape (a value
    with as many elements as the input is reshaped to it: ``--const rate=16000`` binds a
    [1] input too). InputError for a name that is no input, a value of another size, or
    one its integer or bool dtype cannot hold exactly."""
    unknown = sorted(k for k in constants if k not in input_types)
    if unknown:
        raise InputError(f"--const names {unknown}, which are not inputs; the inputs are {sorted(input_types)}")
    out: dict[str, np.ndarray] = {}
    for name, value in constants.items():
        t = input_types[name]
        try:
            given = np.asarray(value)
            array = given.astype(t.dtype.numpy)
        except (TypeError, ValueError) as e:
            raise InputError(f"--const {name}: {value!r} cannot be read as {t.dtype}: {e}") from None
        if array.size != t.size:
            raise InputError(f"--const {name}: {array.size} value(s) given, the input {t} takes {t.size}")
        if t.dtype.numpy.kind in "biu" and not np.array_equal(array, given):
            raise InputError(f"--const {name}: {value!r} is not exactly representable as {t.dtype}")
        out[name] = np.ascontiguousarray(array.reshape(t.shape))
    return out
