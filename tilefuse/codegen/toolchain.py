"""What both code generators need around their compilers: kernel names, the param list,
the cache folder, atomic cache writes and one form of compiler-failure message."""
from __future__ import annotations

import os
import re
import tempfile
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
