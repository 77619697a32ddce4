"""The zoo: every model by name, and ``build``, which makes or reuses its .onnx file.

A built model lives at ``<cache>/<name>-<config>-<dtype>.onnx`` with a sidecar
``<name>-<config>-<dtype>.json`` recording the cache key it was built under, how long
the build took and the file's size. A file is reused only when its sidecar's key
matches the current one; the key covers the builder's source text, the spec's version
and the versions of the libraries that shape the export. Files are written to a
temporary name and renamed into place (model first, sidecar last), so a reader never
sees a half-written model and an interrupted build is simply redone.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import time
from pathlib import Path

import onnx

from . import catalog, edge
from .spec import META_PREFIX, META_RANGES, META_SHAPES, ModelSpec, set_metadata

# The highest IR version written. onnx.helper stamps its newest IR (onnx 1.23: see
# onnx.IR_VERSION); onnxruntime 1.32 reads that, but older runtimes reject IR above 10,
# and IR 10 covers every opset the zoo uses (up to 20).
MAX_IR_VERSION = 10
# Bump to invalidate every cached model (e.g. when finalize() changes).
ZOO_FORMAT = 1
# Protobuf cannot serialise a model of 2 GiB or more in one file.
SINGLE_FILE_LIMIT = 2**31 - 1

ZOO: dict[str, ModelSpec] = {spec.name: spec for spec in (*catalog.specs(), *edge.specs())}


def default_cache_dir() -> Path:
    """``$TILEFUSE_MODEL_CACHE``, else ``~/.cache/tilefuse/models``."""
    env = os.environ.get("TILEFUSE_MODEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "tilefuse" / "models"


def model_path(name: str, config: str = "tiny", dtype: str = "float32",
               cache_dir: Path | None = None) -> Path:
    """Where ``build`` puts (or finds) the model; the file may not exist yet."""
    return Path(cache_dir or default_cache_dir()) / f"{name}-{config}-{dtype}.onnx"


def get_spec(name: str) -> ModelSpec:
    try:
        return ZOO[name]
    except KeyError:
        raise KeyError(f"no model {name!r} in the zoo; known: {', '.join(ZOO)}") from None


def build(name: str, config: str = "tiny", dtype: str = "float32",
          cache_dir: Path | None = None, force: bool = False) -> Path:
    """Build model ``name`` at ``config`` and ``dtype`` unless an up-to-date copy is
    cached; return the path of the self-contained .onnx file.

    The file loads with ``onnx.load`` (no external data), has IR version at most
    ``MAX_IR_VERSION``, passes ``onnx.checker`` (full check) and carries its input
    shapes and integer ranges in ``metadata_props``. Builders of torch models have
    already checked it against torch. Raises ``KeyError`` for an unknown name and
    ``ValueError`` for a config or dtype the model does not have.
    """
    spec = get_spec(name)
    spec.check_config(config)
    spec.check_dtype(dtype)
    path = model_path(name, config, dtype, cache_dir)
    sidecar = path.with_suffix(".json")
    key = cache_key(spec)
    if not force and path.exists() and read_sidecar(sidecar).get("key") == key:
        return path

    path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    model = spec.builder(config, dtype)
    finalize(model, spec, config, dtype)
    seconds = time.perf_counter() - start
    size = model.ByteSize()
    if size >= SINGLE_FILE_LIMIT:
        raise ValueError(f"{path.name}: {size} bytes does not fit one protobuf file")
    write_atomic(path, model.SerializeToString())
    info = {"key": key, "name": name, "config": config, "dtype": dtype,
            "build_seconds": round(seconds, 2), "bytes": size,
            "metadata": {k: v for k, v in ((p.key, p.value) for p in model.metadata_props)
                         if k.startswith(META_PREFIX)}}
    write_atomic(sidecar, json.dumps(info, indent=1).encode())
    return path


def finalize(model: onnx.ModelProto, spec: ModelSpec, config: str, dtype: str) -> None:
    """Cap the IR version, record shapes and ranges, and run the full checker."""
    model.ir_version = min(model.ir_version, MAX_IR_VERSION)
    set_metadata(model, {
        META_PREFIX + "model": f"{spec.name}-{config}-{dtype}",
        META_SHAPES: json.dumps({k: list(v) for k, v in spec.shapes[config].items()}),
        META_RANGES: json.dumps({k: list(v) for k, v in spec.input_ranges(config).items()}),
    })
    onnx.checker.check_model(model, full_check=True)


def cache_key(spec: ModelSpec) -> str:
    """A digest of everything that decides what ``spec``'s builder writes."""
    h = hashlib.sha256()
    h.update(f"format={ZOO_FORMAT};version={spec.version};ir={MAX_IR_VERSION}".encode())
    for module in sorted({*spec.sources, "models.spec", "models.registry"}):
        origin = importlib.util.find_spec(module).origin
        h.update(module.encode() + Path(origin).read_bytes())
    for dist in ("onnx", "torch", "transformers", "onnxscript", *spec.libraries):
        try:
            h.update(f"{dist}={importlib.metadata.version(dist)}".encode())
        except importlib.metadata.PackageNotFoundError:
            h.update(f"{dist}=none".encode())
    return h.hexdigest()[:16]


def read_sidecar(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same folder and a rename,
    so concurrent readers see the old file or the new one, never a partial one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
