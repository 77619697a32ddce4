"""The instruction-set levels a test builds the CPU kernels for, and the prelude's helpers
built alone into a library (a C entry point beside them) for tests that call them through
ctypes."""
from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

from tilefuse.codegen.cpu.build import find_compiler, flags
from tilefuse.cpu_isa import LEVELS, host_level


def host_levels(*only: str) -> list[str]:
    """``native`` and the portable levels this machine runs (its own and those below), or of
    those only the ones in ``only``."""
    host = host_level()
    below = list(LEVELS)[: list(LEVELS).index(host) + 1] if host in LEVELS else []
    return ["native", *(level for level in below if not only or level in only)]


def build_prelude(tmp: Path, source: str, isa: str) -> ctypes.CDLL:
    """``source`` (prelude text and an entry point) compiled for ``isa`` and loaded."""
    (tmp / "p.c").write_text(source)
    subprocess.run([*find_compiler().command, *flags(isa), "-o", str(tmp / "p.so"), str(tmp / "p.c"), "-lm"], check=True)
    return ctypes.CDLL(str(tmp / "p.so"))
