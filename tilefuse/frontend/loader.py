"""Loading an ONNX model safely: parse, external data, checker, opset conversion."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, Mapping

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import external_data_helper, version_converter

from tilefuse.errors import ModelLoadError
from tilefuse.ir.types import TensorType

# Models older than this are converted upward first; converters start here.
MIN_OPSET = 13
# What load_model returns, named for annotations past the frontend (which import no onnx).
ModelProto = onnx.ModelProto


def load_model(
    model: str | os.PathLike[str] | bytes | onnx.ModelProto,
    external_data_dir: str | os.PathLike[str] | None = None,
) -> onnx.ModelProto:
    """Parse a model (path, bytes or proto) and load its external data.

    External data is read from ``external_data_dir``, by default the model file's folder.
    A model given as bytes or as a ModelProto has no folder: its external data is refused
    unless ``external_data_dir`` names one (never the working directory). Every tensor is
    confined alike, initializers and the tensors inside attributes, sparse tensors and
    subgraphs: a location must name a regular file inside the folder (``../secret``, an
    absolute path or a symlink out is refused), and its offset and length must be
    non-negative integers that stay inside the file. A ModelProto given is not modified.
    """
    base: Path | None = None
    if isinstance(model, onnx.ModelProto):
        proto, where = model, "<ModelProto>"
    elif isinstance(model, bytes):
        proto, where = _parse(model, "<bytes>"), "<bytes>"
    elif isinstance(model, (bytearray, memoryview)):
        proto, where = _parse(bytes(model), "<bytes>"), "<bytes>"
    elif isinstance(model, (str, os.PathLike)):
        path = Path(model)
        try:
            if not path.is_file():
                raise ModelLoadError(f"{str(path)[:200]}: no such file")
            data = path.read_bytes()
        except OSError as e:  # a name too long for the file system, a file that cannot be read
            raise ModelLoadError(f"{str(path)[:200]}: cannot be read ({e.strerror})") from None
        proto, where, base = _parse(data, str(path)), str(path), path.resolve().parent
    else:
        raise ModelLoadError(f"a model is a path, bytes or an onnx.ModelProto, got {type(model).__name__}")
    if external_data_dir is not None:
        base = Path(external_data_dir).resolve()
        if not base.is_dir():
            raise ModelLoadError(f"{where}: external_data_dir {str(external_data_dir)!r} is not a directory")
    external = [t for t in _all_tensors(proto) if external_data_helper.uses_external_data(t)]
    if not external:
        return proto
    if base is None:
        raise ModelLoadError(
            f"{where}: tensor {external[0].name!r} keeps its data in an external file "
            f"({_location(external[0])!r}), but a model given as {'bytes' if where == '<bytes>' else 'a ModelProto'} "
            "has no folder to read it from: pass external_data_dir=FOLDER (or the model's path)"
        )
    if proto is model:  # the caller's proto keeps pointing at its files
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
        external = [t for t in _all_tensors(proto) if external_data_helper.uses_external_data(t)]
    for tensor in external:
        tensor.raw_data = _read_external(tensor, base, where)
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]
    return proto


def _all_tensors(proto: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every TensorProto of the model that may hold data: initializers (dense and sparse),
    attribute tensors (dense and sparse), in the main graph, its subgraphs and functions."""
    yield from _graph_tensors(proto.graph)
    for function in proto.functions:
        for node in function.node:
            yield from _attribute_tensors(node)


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    for node in graph.node:
        yield from _attribute_tensors(node)


def _attribute_tensors(node: onnx.NodeProto) -> Iterator[onnx.TensorProto]:
    for attr in node.attribute:
        if attr.HasField("t"):
            yield attr.t
        yield from attr.tensors
        for sparse in (*([attr.sparse_tensor] if attr.HasField("sparse_tensor") else []), *attr.sparse_tensors):
            yield from (sparse.values, sparse.indices)
        if attr.HasField("g"):
            yield from _graph_tensors(attr.g)
        for g in attr.graphs:
            yield from _graph_tensors(g)


def _location(tensor: onnx.TensorProto) -> str:
    return next((e.value for e in tensor.external_data if e.key == "location"), "")


def _read_external(tensor: onnx.TensorProto, base: Path, where: str) -> bytes:
    """The bytes of one external tensor, read only from a regular file inside ``base``."""
    what = f"{where}: external data of tensor {tensor.name!r}"
    fields = {e.key: e.value for e in tensor.external_data}
    location = fields.get("location", "")
    if not location:
        raise ModelLoadError(f"{what} names no location")
    if "\x00" in location:
        raise ModelLoadError(f"{what}: location {location!r} contains a NUL byte")
    offset = _non_negative(fields, "offset", what)
    length = _non_negative(fields, "length", what)
    try:
        target = (base / location).resolve()  # symlinks followed: where the bytes really are
    except (OSError, RuntimeError) as e:  # a symlink loop
        raise ModelLoadError(f"{what}: cannot resolve {location!r}: {e}") from None
    if Path(location).is_absolute() or not target.is_relative_to(base):
        raise ModelLoadError(f"{what}: {location!r} is outside the model's folder {str(base)!r}")
    try:
        exists, regular = target.exists(), target.is_file()
    except OSError as e:  # a name too long for the file system, say
        raise ModelLoadError(f"{what}: cannot read {location[:80]!r}: {e.strerror}") from None
    if not exists:
        raise ModelLoadError(f"{what}: file {location!r} is missing")
    if not regular:
        raise ModelLoadError(f"{what}: {location!r} is not a regular file")
    try:
        # O_NOFOLLOW: the path was resolved above; a symlink put there since is refused.
        fd = os.open(target, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = offset or 0
            if start > size:
                raise ModelLoadError(f"{what}: offset {start} is past the end of {location!r} ({size} bytes)")
            count = size - start if length is None else length
            if start + count > size:
                raise ModelLoadError(
                    f"{what}: {count} bytes from offset {start} run past the end of {location!r} ({size} bytes)"
                )
            f.seek(start)
            data = f.read(count)
    except OSError as e:
        raise ModelLoadError(f"{what}: cannot read {location!r}: {e}") from None
    if len(data) != count:
        raise ModelLoadError(f"{what}: read {len(data)} of {count} bytes from {location!r} (file changed?)")
    return data


def _non_negative(fields: Mapping[str, str], key: str, what: str) -> int | None:
    """``fields[key]`` as a non-negative integer (None when absent); onnx writes decimals."""
    if key not in fields:
        return None
    text = fields[key]
    if not text.isascii() or not text.isdigit():
        raise ModelLoadError(f"{what}: {key} {text!r} is not a non-negative integer")
    return int(text)


def read_structure(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """The model at ``path`` parsed with its external data left unread: for what needs
    only its graph and shapes, not its weights."""
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such file")
    return _parse(path.read_bytes(), str(path))


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise ModelLoadError(f"{where}: not a readable ONNX model (truncated or corrupt?): {e}") from None
    if not proto.graph.node and not proto.graph.output:
        raise ModelLoadError(f"{where}: not an ONNX model (no graph)")
    try:
        _check_text(proto)
    except (UnicodeDecodeError, TypeError):
        raise ModelLoadError(f"{where}: a name in the model is not valid UTF-8 (corrupt?)") from None
    return proto


def _check_text(proto: onnx.ModelProto) -> None:
    """Every name a later stage reads is text. protobuf parses a string field holding bytes
    that are not UTF-8 (a flipped bit) and fails only when it is read, deep inside the
    checker or the converters; read them all once here instead."""
    for op in proto.opset_import:
        _text(op.domain)
    for f in proto.functions:
        _text(f.name, f.domain, *f.input, *f.output)
    graphs = [proto.graph]
    while graphs:
        g = graphs.pop()
        _text(g.name, *(t.name for t in g.initializer), *(v.name for v in (*g.input, *g.output, *g.value_info)))
        for n in g.node:
            _text(n.name, n.op_type, n.domain, *n.input, *n.output)
            for a in n.attribute:
                _text(a.name)
                graphs.extend([a.g] if a.HasField("g") else [])
                graphs.extend(a.graphs)


def _text(*values: object) -> None:
    for v in values:
        if not isinstance(v, str):
            raise TypeError("not text")


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
    undefined = _undefined_element_type(model)
    if undefined:
        raise ModelLoadError(f"model {model.graph.name!r} is not valid ONNX: {undefined}")


def _undefined_element_type(model: onnx.ModelProto) -> str:
    """What declares an element type no ONNX version defines (the checker lets it pass)."""
    defined = set(onnx.TensorProto.DataType.values())
    for graph in _graphs(model.graph):
        for vi in (*graph.input, *graph.output, *graph.value_info):
            code = vi.type.tensor_type.elem_type
            if vi.type.HasField("tensor_type") and code not in defined:
                return f"value {vi.name!r} has element type {code}, which is no ONNX type"
    for t in _all_tensors(model):
        if t.data_type not in defined:
            return f"tensor {t.name!r} has data type {t.data_type}, which is no ONNX type"
    return ""


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph inside it."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for sub in (*([attr.g] if attr.HasField("g") else []), *attr.graphs):
                yield from _graphs(sub)


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


def without_weights(proto: onnx.ModelProto, input_types: Mapping[str, TensorType] | None = None) -> onnx.ModelProto:
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
            for d in t.shape:
                dims.add().dim_value = d
    for init in proto.graph.initializer:
        if int(np.prod(init.dims)) <= 4096:  # shape-like constants: inference may need values
            g.initializer.append(init)
        else:
            g.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return m
