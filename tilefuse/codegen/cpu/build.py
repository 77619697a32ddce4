"""The C compiler driver and the kernel cache.

A kernel is built once per (source, compiler version, flags, host CPU): the cache key is
a sha256 of those, and ``$TILEFUSE_CACHE/kernels`` (default ``~/.cache/tilefuse/kernels``)
holds ``SYMBOL-KEY.c`` and ``SYMBOL-KEY.so``, with the library's sha256 beside it
(``.so.sha256``): a library that does not match it is compiled again, never loaded (a
truncated one would kill the process that maps it with SIGBUS). Files are written under
a temporary name and renamed into place, so builds running in parallel (threads or
processes) never see half a file; the worst case is two processes compiling the same
kernel once each. Temporary files a killed build left are removed once they are old.
"""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tilefuse.codegen.cpu.emit import CSource
from tilefuse.cpu_isa import march
from tilefuse.codegen.toolchain import commit_entry, compiler_failed, ensure_text, entry_ok
from tilefuse.errors import CompileError

# No -ffast-math: NaN, inf and signed zeros must behave as in the reference. Kernels never
# read floating-point exception flags or errno, so operations may be assumed not to trap
# (which lets selects and conversions vectorise) and libm need not set errno (sqrtf inline).
FLAGS = ("-fno-trapping-math", "-fno-math-errno", "-fopenmp", "-fPIC", "-shared", "-std=gnu11")


# GCC tuned for AMD's Zen cores (``-march=native`` there) splits a lone accumulator's chain
# of fused multiply-adds into multiplies and adds: sums then round differently by where a
# product's tiles cut it and by host. Every chain stays fused, as on other hosts.
GCC_FLAGS = ("--param=avoid-fma-max-bits=0",)


def flags(isa: str, compiler: "Compiler | None" = None) -> tuple[str, ...]:
    """The compiler flags of a kernel built for ``isa`` (tilefuse/cpu_isa.py) by
    ``compiler`` (default: ``find_compiler()``)."""
    gcc = _is_gcc(compiler or find_compiler())
    return ("-O3", march(isa), *FLAGS, *(GCC_FLAGS if gcc else ()))


def _is_gcc(compiler: "Compiler") -> bool:
    version = compiler.version.lower()
    return "clang" not in version and ("gcc" in version or "free software foundation" in version)


COMPILE_TIMEOUT_S = 600


@dataclass(frozen=True)
class Compiler:
    command: tuple[str, ...]  # e.g. ("cc",) or ("ccache", "gcc")
    version: str  # its ``--version`` output: part of the cache key

    def __str__(self) -> str:
        return " ".join(self.command)


def find_compiler() -> Compiler:
    """``$CC`` if set, else ``cc``; CompileError if there is none."""
    return _compiler(os.environ.get("CC", "").strip() or "cc")


@functools.lru_cache(maxsize=8)
def _compiler(spec: str) -> Compiler:
    command = tuple(shlex.split(spec))
    if not command or shutil.which(command[0]) is None:
        raise CompileError(f"no C compiler found: {spec!r} is not on PATH; install gcc or clang, or set $CC")
    try:
        out = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise CompileError(f"C compiler {spec!r} does not run: {e}") from None
    if out.returncode != 0:
        raise CompileError(f"C compiler {spec!r} does not run: {out.stderr.strip()[:500]}")
    return Compiler(command, out.stdout.strip())


@functools.lru_cache(maxsize=1)
def _host() -> str:
    """What ``-march=native`` depends on: the machine and its CPU feature flags."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = line
                break
    except OSError:
        pass
    return f"{platform.machine()};{flags}"


def cache_key(source: CSource, compiler: Compiler, isa: str = "native") -> str:
    """The kernel's identity in the cache: source, compiler, flags and, for ``native``
    builds, this machine (an x86-64 level builds the same anywhere)."""
    h = hashlib.sha256()
    host = _host() if isa == "native" else platform.machine()
    for part in (source.text, compiler.version, " ".join(flags(isa, compiler)), host):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def library_path(source: CSource, compiler: Compiler, cache_dir: Path, isa: str = "native") -> Path:
    return cache_dir / f"{source.symbol}-{cache_key(source, compiler, isa)[:16]}.so"


def compile_cached(source: CSource, compiler: Compiler, cache_dir: Path, isa: str = "native") -> tuple[Path, Path]:
    """The shared library and C file of ``source``, compiling only on a cache miss."""
    lib = library_path(source, compiler, cache_dir, isa)
    c_file = lib.with_suffix(".c")
    ensure_text(c_file, source.text.encode())  # the library's source, and what is compiled on a miss
    if entry_ok(lib):
        return lib, c_file
    fd, tmp = tempfile.mkstemp(prefix=f".{lib.stem}.", suffix=".so.tmp", dir=cache_dir)
    os.close(fd)
    try:
        cmd = [*compiler.command, *flags(isa, compiler), "-o", tmp, str(c_file)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise CompileError(f"kernel {source.symbol}: {compiler} took over {COMPILE_TIMEOUT_S} s on {c_file}") from None
        if done.returncode != 0:
            raise compiler_failed(source.symbol, str(compiler), done.returncode, done.stderr or done.stdout, c_file)
        commit_entry(Path(tmp), lib)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib, c_file
