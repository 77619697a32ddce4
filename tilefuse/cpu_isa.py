"""The instruction-set level CPU kernels are built for, and whether a machine has it.

    isa="native"      -march=native: this machine's every extension (the default); the plan
                      records them, and loads only where all are present
    isa="x86-64-v3"   AVX2, FMA, BMI1/2, F16C, LZCNT, MOVBE: nearly every x86 server since 2013
    isa="x86-64-v4"   v3 and AVX-512 F/BW/CD/DQ/VL
    isa="x86-64-v2"   SSE4.2, POPCNT, CMPXCHG16B

The levels are the x86-64 psABI's; a plan built for one runs on any machine that has its
extensions, and a plan's kernels are checked against the machine before they are loaded
(a missing extension would end the process with SIGILL at the first kernel).
Extensions are named as Linux's /proc/cpuinfo names them.
"""
from __future__ import annotations

import functools
import platform
import re
from pathlib import Path

_V2 = ("cx16", "lahf_lm", "popcnt", "pni", "sse4_1", "sse4_2", "ssse3")
_V3 = _V2 + ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave")
_V4 = _V3 + ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
LEVELS: dict[str, tuple[str, ...]] = {"x86-64-v2": _V2, "x86-64-v3": _V3, "x86-64-v4": _V4}
CHOICES = ("native", *LEVELS)
# extensions a compiler may use under -march=native, as /proc/cpuinfo names them
_ISA_FLAG = re.compile(r"^(sse\w*|ssse3|pni|avx\w*|amx\w*|fma\w*|bmi\d|f16c|abm|movbe|popcnt|cx16|lahf_lm|xsave\w*|"
                       r"aes|vaes|pclmulqdq|vpclmulqdq|gfni|sha_ni|adx|rdrand|rdseed|lzcnt|clflushopt|clwb|"
                       r"movdiri|movdir64b|serialize|waitpkg|avx_vnni\w*)$")


def check_isa(isa: str) -> str:
    if isa not in CHOICES:
        raise ValueError(f"CPU ISA level must be one of {list(CHOICES)}, got {isa!r}")
    if isa != "native" and platform.machine() not in ("x86_64", "AMD64"):
        raise ValueError(f"CPU ISA level {isa} is an x86-64 level; this machine is {platform.machine()} (use native)")
    return isa


def march(isa: str) -> str:
    """The compiler's -march for ``isa``."""
    return f"-march={check_isa(isa)}"


@functools.lru_cache(maxsize=1)
def host_flags() -> frozenset[str]:
    """This machine's CPU flags (empty where /proc/cpuinfo is not there to say)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def host_level() -> str:
    """The highest x86-64 level this machine has ("" where none or not x86-64)."""
    have = host_flags()
    best = ""
    for level, needs in LEVELS.items():
        if set(needs) <= have:
            best = level
    return best


def requires(isa: str) -> tuple[str, ...]:
    """The extensions kernels built for ``isa`` may use: the level's, or for ``native``
    this machine's instruction-set extensions."""
    if check_isa(isa) != "native":
        return tuple(sorted(LEVELS[isa]))
    return tuple(sorted(f for f in host_flags() if _ISA_FLAG.match(f)))


def has(isa: str, *extensions: str) -> bool:
    """Whether kernels built for ``isa`` may use every one of ``extensions`` (the
    lowering's and the printer's choices of a layout or a core by instruction set)."""
    have = requires(isa)
    return all(e in have for e in extensions)


def target_level(target) -> str:
    """The level a target's CPU kernels are built for (``native`` where its code
    generator has none: not a CPU target)."""
    return getattr(target.codegen, "isa", "native")


def missing(needed: tuple[str, ...] | list[str]) -> list[str]:
    """The extensions in ``needed`` this machine lacks ([] where it cannot tell: no
    /proc/cpuinfo)."""
    have = host_flags()
    return [f for f in needed if f not in have] if have else []


def check_host(plan) -> None:
    """PlanError where this machine lacks an extension the plan's CPU kernels may use."""
    from tilefuse.errors import PlanError

    lacking = missing(plan.cpu_requires)
    if lacking:
        isa = (plan.target_spec.get("codegen") or {}).get("isa", "native")
        here = host_level() or "none of the x86-64 levels"
        raise PlanError(f"this plan's CPU kernels were built for {isa} and may use {', '.join(lacking)}, which this "
                        f"machine's CPU lacks (it has {here}); compile the model on this machine, or with "
                        f"--cpu-isa (Python: target adjust(get_target('cpu'), codegen__isa=...)) set to a level it has")
