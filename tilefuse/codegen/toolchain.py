"""What both code generators need around their compilers: kernel names, the param list,
the cache folder, atomic and verified cache entries and one form of compiler-failure
message.

A cache entry (a compiled library, a cubin, lowered source, launch metadata) is never
trusted by its name alone: beside each one its sha256 is recorded (``NAME.sha256``), and
an entry that does not hash to it (truncated by a full disk or a crash before its data
reached the disk, edited, or without a digest) is rebuilt and replaced, never loaded.
The digest is written before the entry is renamed into place, so a reader sees either a
match or a mismatch, never a half-written file.
"""
from __future__ import annotations

import hashlib
import os
import re
import tempfile
import time
from pathlib import Path

from tilefuse.codegen.artifact import ParamSpec
from tilefuse.errors import CompileError
from tilefuse.tile_ir.ir import STATUS, TileProgram

ERROR_LINES = 40  # of a compiler's output, in a CompileError


def kernel_stem(name: str) -> str:
    """The part of a program name that describes its content: sanitised, without the
    ``k<group id>_`` prefix (a position in one model, not a property of the kernel)."""
    stem = re.sub(r"^k[0-9]+_", "", name)
    stem = re.sub(r"[^A-Za-z0-9_]", "_", stem).strip("_")[:48] or "kernel"
    return stem if not stem[0].isdigit() else "k_" + stem


def param_specs(program: TileProgram) -> tuple[ParamSpec, ...]:
    """The kernel's arguments: its params, then the status word if it checks indices."""
    specs = [ParamSpec(b.name, b.dtype.value, b.shape, "input" if k < program.num_inputs else "output")
             for k, b in enumerate(program.params)]
    if program.index_sites:
        specs.append(ParamSpec(STATUS.name, STATUS.dtype.value, STATUS.shape, "status"))
    return tuple(specs)


def default_cache_dir() -> Path:
    """``$TILEFUSE_CACHE/kernels``, default ``~/.cache/tilefuse/kernels``."""
    root = os.environ.get("TILEFUSE_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "tilefuse") / "kernels"


# A temporary file older than this belongs to no live build (the C compiler is stopped
# after 600 s, nvcc after 900 s): it is what a killed build left, and is removed.
STALE_TMP_S = 3600


def digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def entry_ok(path: Path) -> bool:
    """True if the cache entry exists and hashes to the digest recorded beside it."""
    return read_entry(path) is not None


def read_entry(path: Path) -> bytes | None:
    """The entry's bytes if they hash to its recorded digest; None for a miss (absent,
    no digest, or a digest that differs: the caller builds it again)."""
    try:
        want = digest_path(path).read_text().strip()
        data = path.read_bytes()
    except OSError:
        return None
    return data if hashlib.sha256(data).hexdigest() == want else None


def store_entry(path: Path, data: bytes) -> None:
    """Put ``data`` into the cache as ``path`` with its digest."""
    write_atomic(digest_path(path), hashlib.sha256(data).hexdigest().encode())
    write_atomic(path, data)


def commit_entry(tmp: Path, path: Path) -> None:
    """Move a build output (``tmp``, beside ``path``) into the cache with its digest."""
    write_atomic(digest_path(path), hashlib.sha256(tmp.read_bytes()).hexdigest().encode())
    os.replace(tmp, path)


def ensure_text(path: Path, data: bytes) -> None:
    """``path`` holds exactly ``data`` (a compiler's input: rewritten if it differs)."""
    try:
        if path.read_bytes() == data:
            return
    except OSError:
        pass
    write_atomic(path, data)


def sweep_stale(cache_dir: Path, now: float | None = None) -> list[Path]:
    """Remove the temporary files (``.*.tmp``) that builds killed long ago left in
    ``cache_dir``; a younger one may be a build running now, and stays. Returns those removed."""
    limit = (time.time() if now is None else now) - STALE_TMP_S
    removed = []
    for tmp in cache_dir.glob(".*.tmp"):
        try:
            if tmp.stat().st_mtime < limit:
                tmp.unlink()
                removed.append(tmp)
        except OSError:  # gone already (another sweep), or not ours to remove
            pass
    return removed


def write_atomic(path: Path, data: bytes) -> None:
    """Write under a temporary name and rename into place: parallel builds never see half
    a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def compiler_failed(kernel: str, tool: str, code: int, output: str, source: Path) -> CompileError:
    """The error for a compiler that exited ``code``: kernel, tool, source file, and the
    first ERROR_LINES lines of what the compiler said."""
    lines = output.strip().splitlines()
    more = f"\n... ({len(lines) - ERROR_LINES} more lines)" if len(lines) > ERROR_LINES else ""
    return CompileError(f"kernel {kernel}: {tool} failed (exit {code}) on {source}:\n" + "\n".join(lines[:ERROR_LINES]) + more)
