"""The ``.tfplan`` directory: manifest.json, weights.safetensors and kernels/.

Saving writes a complete plan into a temporary sibling directory and then moves it into
place, so a crash never leaves half a plan under the final name. Loading checks
everything it reads (JSON fields, format version, kernel hashes, weight dtypes and
shapes) and never unpickles or runs Python from the plan; each failure is a PlanError
naming the file.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import safetensors
from safetensors.numpy import load_file, save_file

from tilefuse.errors import PlanError
from tilefuse.plan.manifest import Decoder, encode
from tilefuse.plan.model import FORMAT_VERSION, BufferKind, Plan
from tilefuse.plan.verify import verify_plan

MANIFEST = "manifest.json"
WEIGHTS = "weights.safetensors"
KERNELS = "kernels"


def save_plan(plan: Plan, path: Path) -> Path:
    """Write ``plan`` to ``path`` (a directory, replaced if it holds an older plan)."""
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
            shutil.copyfile(kernel.path, tmp / rel)
            # The build cache may have changed since link; the plan must hold what was linked.
            if sha256_file(tmp / rel) != kernel.sha256:
                raise PlanError(f"{kernel.path}: changed since the plan was linked (sha256 differs)")
            files[kernel.name] = rel
        constants = {b.name for b in plan.buffers if b.kind is BufferKind.CONSTANT}
        save_file({k: v for k, v in plan.weights.items() if k in constants}, tmp / WEIGHTS)
        (tmp / MANIFEST).write_text(json.dumps(encode(plan, files), indent=1) + "\n")
        if path.exists():
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        tmp.rename(path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def load_plan(path: str | Path) -> Plan:
    """Read and check a ``.tfplan`` directory."""
    root = Path(path)
    manifest = root / MANIFEST
    if not root.is_dir():
        raise PlanError(f"{root}: not a plan directory")
    if not manifest.is_file():
        raise PlanError(f"{manifest}: missing; {root} is not a complete plan")
    try:
        data = json.loads(manifest.read_bytes())
    except (ValueError, UnicodeDecodeError) as e:
        raise PlanError(f"{manifest}: truncated or not valid JSON ({e})") from None
    dec = Decoder(data, str(manifest), root)
    header = dec.header()
    if header["format_version"] != FORMAT_VERSION:
        raise PlanError(
            f"{manifest}: plan format version {header['format_version']} (written by tilefuse "
            f"{header['tilefuse_version']}), but this tilefuse reads version {FORMAT_VERSION}; compile the model again"
        )
    buffers = dec.buffers()
    kernels = dec.kernels()
    for kernel in kernels.values():
        if not kernel.path.is_file():
            raise PlanError(f"{kernel.path}: kernel file missing (kernel {kernel.name})")
        got = sha256_file(kernel.path)
        if got != kernel.sha256:
            raise PlanError(f"{kernel.path}: sha256 {got[:12]}... differs from the manifest's {kernel.sha256[:12]}...: the file was modified")
    plan = Plan(
        target=header["target"],  # type: ignore[arg-type]
        source_sha256=header["source_model_sha256"],  # type: ignore[arg-type]
        source_path=header["source_model_path"],  # type: ignore[arg-type]
        precision=header["precision"],  # type: ignore[arg-type]
        tilefuse_version=header["tilefuse_version"],  # type: ignore[arg-type]
        buffers=buffers,
        inputs=dec.bindings("inputs", buffers),
        outputs=dec.bindings("outputs", buffers),
        kernels=kernels,
        steps=dec.steps(),
        arena_bytes=header["arena_bytes"],  # type: ignore[arg-type]
        weights=_load_weights(root / WEIGHTS),
    )
    try:
        verify_plan(plan)
    except PlanError as e:
        raise PlanError(f"{root}: {e}") from None
    return plan


def _load_weights(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise PlanError(f"{path}: weights file missing")
    try:
        return load_file(path)
    except (safetensors.SafetensorError, OSError, ValueError, KeyError, TypeError) as e:
        raise PlanError(f"{path}: cannot read the weights ({e})") from None


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
