"""What code generation hands to the plan: one built kernel and how to call it.

This is the contract between ``codegen/`` (which builds kernels) and ``plan/`` (which
links them into an executable plan). It holds data only, so it imports nothing from
the code generators and stays cheap to import.

Calling convention (``params``): the kernel takes, in order, one pointer per param of its
TileProgram: the values lowering bound to inputs (``Lowered.bindings``: the group's
inputs, less the scalar constants folded into the code), then one per output
(``group.outputs``). Every pointer is the base of a dense, contiguous, row-major tensor
of exactly the declared dtype and shape; ``plan.link`` checks each against its value.
A kernel that reads indices at run time takes one more, last: its status word (role
"status", int64[2], zero before the kernel runs). It writes it only when it finds an
index out of range: word 0 = the check site + 1, word 1 = the index (the caller names the
site; see tile_ir/lower/checks.py). A bad index never makes the kernel address memory
outside its params: it reads position 0 instead.

CPU ABI: ``void SYMBOL(void **args)`` in a shared library; ``args[i]`` is param i. The
runtime may call a kernel from several threads at once (each with its own buffers), so a
kernel must not keep mutable global state.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tilefuse.codegen.launch import LaunchRecord

ROLES = ("input", "output", "status")


@dataclass(frozen=True)
class ParamSpec:
    """One kernel argument: ``dtype`` is a DType value string ("float32", "bfloat16", ...)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    role: str  # "input" | "output" | "status"

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"param {self.name!r}: role must be one of {ROLES}, got {self.role!r}")


@dataclass(frozen=True)
class KernelArtifact:
    """A built kernel.

    ``name`` is deterministic (the ops it holds plus ``_`` and ten hex digits of a content
    hash: ``plan.model.KERNEL_NAME``) and is its file name inside a plan; ``symbol`` is the
    entry that name gives on the target (cpu: the name; cuda: ``NAME_kernel``), which the
    plan checks (the family's ``kernel_format``, ``tilefuse.backends``). Two groups may
    share one artifact (identical layers) as long as their params agree. ``launch`` is the
    family's launch record (``codegen/launch.py``: ``CpuLaunch``, ``CudaLaunch``).
    """

    name: str
    symbol: str
    path: Path
    params: tuple[ParamSpec, ...]
    launch: LaunchRecord
    source: Path | None = None
