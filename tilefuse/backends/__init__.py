"""The target families tilefuse compiles for and runs, in one registry.

    backend = backends.for_target(target)   # a Target or a target name: "cpu", "cuda:sm_90a"
    backend = backends.get("cuda")          # by family
    artifacts = backend.build_all(programs, target)

Each family registers one ``Backend`` (``base.py``); stages that used to test target
names ask it instead. Registering a family twice is an error at import time.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from tilefuse.backends.base import Backend, KernelFormat
from tilefuse.backends.cpu import CpuBackend
from tilefuse.backends.cuda import CudaBackend
from tilefuse.errors import TilefuseError

if TYPE_CHECKING:
    from tilefuse.target import Target

__all__ = ["Backend", "KernelFormat", "families", "family", "find", "for_target", "get", "register"]

_BACKENDS: dict[str, Backend] = {}


def register(backend: Backend) -> None:
    if backend.family in _BACKENDS:
        raise TilefuseError(f"target family {backend.family!r} is registered twice")
    _BACKENDS[backend.family] = backend


def families() -> list[str]:
    return sorted(_BACKENDS)


def family(target: str) -> str:
    """A target name's family: the part before ":" ("cuda:sm_90a" -> "cuda")."""
    return target.split(":")[0]


def find(name: str) -> Backend | None:
    """The backend of a family, or None (for callers that phrase their own error)."""
    return _BACKENDS.get(name)


def get(name: str) -> Backend:
    """The backend of a family; TilefuseError naming the known ones if there is none."""
    backend = _BACKENDS.get(name)
    if backend is None:
        raise TilefuseError(f"no backend for target family {name!r}; known families: {families()}")
    return backend


def for_target(target: Target | str) -> Backend:
    """The backend of a target or target name."""
    return get(family(target if isinstance(target, str) else target.name))


register(CpuBackend())
register(CudaBackend())
