"""The ``.tfplan`` directory: manifest.json, weights.safetensors and kernels/.

A plan holds native code, as a TensorRT engine does: loading one means running its
kernels. The manifest records a sha256 of every kernel file and of the weights, which
guards against corruption (a truncated copy, flipped bits, a file swapped by mistake),
not against a hostile author: whoever writes a plan can write its hashes too.

Saving writes a complete plan into a temporary sibling directory and then moves it into
place, so a crash never leaves half a plan under the final name. Loading checks
everything it reads (the manifest's schema and bounds, format version, kernel and
weight hashes, weight dtypes and shapes), never unpickles or runs Python from the plan,
and reads nothing outside its directory: every file is opened relative to the plan's
own directory handle, refusing symbolic links, and kernel files are named by their
kernel's name only. Each failure is a PlanError naming the file.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import safetensors
from safetensors.numpy import save_file

from tilefuse.errors import PlanError
from tilefuse.ir.dtypes import DType
from tilefuse.plan.manifest import Decoder, encode
from tilefuse.plan.model import FORMAT_VERSION, BufferKind, Plan
from tilefuse.plan.verify import verify_plan

MANIFEST = "manifest.json"
MANIFEST_DIGEST = "manifest.sha256"  # the manifest's own sha256: edits and flips that keep valid JSON
WEIGHTS = "weights.safetensors"
KERNELS = "kernels"
MAX_MANIFEST_BYTES = 256 << 20  # far above any model's manifest; a bigger one is not a plan
# safetensors' dtype names, for the dtypes a plan's weights have (safetensors.numpy.load
# reads bytes without bfloat16; its file reader has it, but would read the file again)
_SAFETENSORS_DTYPES = {
    "F64": DType.FLOAT64, "F32": DType.FLOAT32, "F16": DType.FLOAT16, "BF16": DType.BFLOAT16,
    "I64": DType.INT64, "I32": DType.INT32, "I16": DType.INT16, "I8": DType.INT8,
    "U64": DType.UINT64, "U32": DType.UINT32, "U16": DType.UINT16, "U8": DType.UINT8, "BOOL": DType.BOOL,
}


def save_plan(plan: Plan, path: Path) -> Path:
    """Write ``plan`` to ``path`` (a directory, replaced if it holds an older plan)."""
    verify_plan(plan)  # also: every kernel's name and suffix are those of a generated kernel
    if path.exists() and not (path / MANIFEST).is_file() and (not path.is_dir() or any(path.iterdir())):
        raise PlanError(f"{path}: exists and is not a plan; refusing to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / KERNELS).mkdir(parents=True)
    try:
        files = {}
        for kernel in plan.kernels.values():
            rel = f"{KERNELS}/{kernel.name}{kernel.suffix}"
            # The build cache may have changed since link; the plan must hold what was linked.
            data = read_verified(kernel.path, kernel.sha256, f"kernel {kernel.name}")
            (tmp / rel).write_bytes(data)
            files[kernel.name] = rel
        constants = {b.name for b in plan.buffers if b.kind is BufferKind.CONSTANT}
        save_file({k: v for k, v in plan.weights.items() if k in constants}, tmp / WEIGHTS)
        write_manifest(tmp, encode(plan, files, sha256_file(tmp / WEIGHTS)))
        if path.exists():
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        tmp.rename(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def write_weights(path: str | Path, tensors: dict[str, np.ndarray]) -> None:
    """Give a saved plan other weights and record their hash in its manifest: for tools
    that carry a plan without its weights (too large to travel) and synthesise them where
    it runs. ``load_plan`` checks them against the constant buffers as ever."""
    root = Path(path)
    manifest = json.loads((root / MANIFEST).read_text())
    tmp = root / f".{WEIGHTS}.tmp-{os.getpid()}"
    try:
        save_file(tensors, tmp)
        manifest["weights_sha256"] = sha256_file(tmp)
        os.replace(tmp, root / WEIGHTS)
    finally:
        tmp.unlink(missing_ok=True)
    write_manifest(root, manifest)


def write_manifest(root: Path, manifest: dict) -> None:
    """``manifest.json`` and, beside it, its sha256 (which ``load_plan`` checks last)."""
    data = (json.dumps(manifest, indent=1) + "\n").encode()
    (root / MANIFEST).write_bytes(data)
    (root / MANIFEST_DIGEST).write_text(hashlib.sha256(data).hexdigest() + "\n")


def load_plan(path: str | Path) -> Plan:
    """Read and check a ``.tfplan`` directory."""
    root = Path(path)
    with _PlanDir(root) as files:
        manifest = files.read(MANIFEST, "missing; not a complete plan", MAX_MANIFEST_BYTES)
        digest = files.read(MANIFEST_DIGEST, "missing; not a complete plan", 128)
        data = _parse_manifest(manifest, root / MANIFEST)
        dec = Decoder(data, str(root / MANIFEST), root)
        format_version, tilefuse_version = dec.version()
        if format_version != FORMAT_VERSION:
            raise PlanError(
                f"{root / MANIFEST}: plan format version {format_version} (written by tilefuse "
                f"{tilefuse_version}), but this tilefuse reads version {FORMAT_VERSION}; compile the model again"
            )
        header = dec.header()
        dec.check_target(header.target)
        buffers = dec.buffers()
        kernels = dec.kernels()
        for kernel in kernels.values():
            raw = files.read(f"{KERNELS}/{kernel.path.name}", f"kernel file missing (kernel {kernel.name})")
            _check_sha256(raw, kernel.sha256, kernel.path, f"kernel {kernel.name}")
        raw = files.read(WEIGHTS, "weights file missing")
        weights = _load_weights(raw, header.weights_sha256, root / WEIGHTS)
        plan = Plan(
            target=header.target,
            source_sha256=header.source_sha256,
            source_path=header.source_path,
            precision=header.precision,
            target_spec=header.target_spec,
            target_fingerprint=header.target_fingerprint,
            cpu_requires=header.cpu_requires,
            tilefuse_version=tilefuse_version,
            buffers=buffers,
            inputs=dec.bindings("inputs", buffers),
            outputs=dec.bindings("outputs", buffers),
            kernels=kernels,
            steps=dec.steps(),
            arena_bytes=header.arena_bytes,
            weights=weights,
        )
    try:
        verify_plan(plan)
    except PlanError as e:
        raise PlanError(f"{root}: {e}") from None
    # Last, so that a field out of its bounds is named above: an edit or a flipped bit that
    # left a manifest every check accepts still changes what the plan computes.
    _check_sha256(manifest, digest.decode(errors="replace").strip(), root / MANIFEST, "the manifest")
    return plan


def _parse_manifest(raw: bytes, where: Path) -> object:
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise PlanError(f"{where}: truncated or not valid JSON ({str(e)[:200]})") from None
    except RecursionError:  # json's parser recurses once per nesting level
        raise PlanError(f"{where}: nested too deeply to be a plan's manifest") from None


def _load_weights(raw: bytes, sha256: str, where: Path) -> dict[str, np.ndarray]:
    """The tensors of the weights file's bytes, once they hash to ``sha256``."""
    _check_sha256(raw, sha256, where, "the weights")
    try:
        tensors = safetensors.deserialize(raw)
    except (safetensors.SafetensorError, ValueError, TypeError) as e:
        raise PlanError(f"{where}: cannot read the weights ({str(e)[:200]})") from None
    out = {}
    for name, t in tensors:
        dtype = _SAFETENSORS_DTYPES.get(t["dtype"])
        if dtype is None:
            raise PlanError(f"{where}: tensor {name!r:.60} has dtype {t['dtype']!r:.20}, which no plan holds")
        # deserialize has checked that the data is exactly the shape's size
        out[name] = np.frombuffer(t["data"], dtype.numpy).reshape(t["shape"])
    return out


def _check_sha256(data: bytes, want: str, path: Path, what: str) -> None:
    got = hashlib.sha256(data).hexdigest()
    if got != want:
        raise PlanError(f"{path}: sha256 {got[:12]}... differs from the manifest's {want[:12]}...: "
                        f"the file was modified ({what})")


class _PlanDir:
    """The plan's directory, opened once: files are read relative to its handle, one
    plain name at a time, so a symlink anywhere inside (``kernels`` itself, a kernel,
    the weights) or a name swapped for one during the load cannot lead outside it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        try:
            self.fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            raise PlanError(f"{root}: not a plan directory") from None
        self._dirs: dict[str, int] = {}

    def __enter__(self) -> _PlanDir:
        return self

    def __exit__(self, *exc: object) -> None:
        for fd in self._dirs.values():
            os.close(fd)
        os.close(self.fd)

    def read(self, rel: str, missing: str, limit: int | None = None) -> bytes:
        """The bytes of ``rel`` ("NAME" or "DIR/NAME"); PlanError if it is missing (the
        message says ``missing``), a symlink or not a regular file."""
        *parents, name = rel.split("/")
        fd = self.fd
        for i, part in enumerate(parents):
            sub = "/".join(parents[: i + 1])
            if sub not in self._dirs:
                self._dirs[sub] = _open_plain(fd, part, self.root / sub, os.O_DIRECTORY, "missing")
            fd = self._dirs[sub]
        # O_NONBLOCK: a FIFO in a file's place must not hang the load (fstat refuses it next)
        f = _open_plain(fd, name, self.root / rel, os.O_NONBLOCK, missing)
        if not stat.S_ISREG(os.fstat(f).st_mode):  # a folder or a device in a file's place
            os.close(f)
            raise PlanError(f"{self.root / rel}: not a regular file")
        with os.fdopen(f, "rb") as stream:
            data = stream.read(limit + 1 if limit is not None else -1)
        if limit is not None and len(data) > limit:
            raise PlanError(f"{self.root / rel}: larger than {limit} bytes; not a plan's file")
        return data


def _open_plain(dir_fd: int, name: str, shown: Path, flags: int, missing: str) -> int:
    try:
        return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise PlanError(f"{shown}: {missing}") from None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.EMLINK) or (e.errno == errno.ENOTDIR and os.path.islink(shown)):
            raise PlanError(f"{shown}: a symbolic link; a plan's files must be its own") from None
        raise PlanError(f"{shown}: cannot be read ({e.strerror})") from None


def read_verified(path: Path, sha256: str, what: str) -> bytes:
    """The bytes of a kernel file, once they are known to hash to ``sha256``: what a
    runtime loads must be these bytes (or a private copy of them), never the path again,
    which may have changed since."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise PlanError(f"{path}: {what}: file missing") from None
    except OSError as e:
        raise PlanError(f"{path}: {what}: cannot be read ({e.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise PlanError(f"{path}: {what}: not a regular file")
        data = f.read()
    _check_sha256(data, sha256, path, what)
    return data


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
