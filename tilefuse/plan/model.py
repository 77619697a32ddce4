"""The in-memory plan: buffers, kernels, steps, the arena and the weights.

A Plan is what ``link`` builds from a partition and its kernels, what ``load_plan``
reads back from a ``.tfplan`` directory and what a runtime executes. It holds no graph:
every tensor the steps touch is a numbered Buffer, every step names buffers by id.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Union

import numpy as np

from tilefuse.codegen.artifact import ParamSpec
from tilefuse.ir.prims import Primitive
from tilefuse.ir.types import TensorType

FORMAT_VERSION = 1
ALIGN = 64  # bytes: arena offsets and the arena base; a cache line, an AVX-512 vector


class BufferKind(str, enum.Enum):
    INPUT = "input"  # bound to a user feed on each run
    OUTPUT = "output"  # a graph output written by a step: in the arena, copied out at the end
    CONSTANT = "constant"  # a weight, from weights.safetensors
    INTERMEDIATE = "intermediate"  # written and read by steps: in the arena

    @property
    def in_arena(self) -> bool:
        return self in (BufferKind.OUTPUT, BufferKind.INTERMEDIATE)


@dataclass(frozen=True, slots=True)
class Buffer:
    """A dense row-major tensor; ``offset`` into the arena for arena kinds, else None."""

    id: int
    name: str
    kind: BufferKind
    type: TensorType
    offset: int | None = None

    @property
    def nbytes(self) -> int:
        return self.type.nbytes


@dataclass(frozen=True, slots=True)
class Binding:
    """A graph input or output name and the buffer that holds it."""

    name: str
    buffer: int


@dataclass(frozen=True, eq=False)
class Kernel:
    """A compiled kernel as the plan knows it; ``path`` is where its file is now."""

    name: str
    symbol: str
    path: Path
    sha256: str
    launch: Mapping[str, object]
    params: tuple[ParamSpec, ...]

    @property
    def suffix(self) -> str:
        return self.path.suffix


@dataclass(frozen=True, slots=True)
class IndexSite:
    """What a kernel's index check ``k`` (its ``sites[k]``) checks: ``what`` names the
    indices for people (the graph input they come from, when they do, and the ONNX node
    reading them); valid indices lie in ``[-extent, extent)``."""

    what: str
    extent: int

    def message(self, value: int) -> str:
        return f"index {value} is outside [-{self.extent}, {self.extent}) in {self.what}"


@dataclass(frozen=True, slots=True)
class KernelStep:
    """Call ``kernel`` with the buffers ``inputs + outputs`` as its arguments, in order.

    A kernel that checks indices read at run time (``sites``, one per check) takes a
    status word after them (codegen/artifact.py); the runtime gives each such step one of
    its own (``Plan.checked_steps``) and reports a bad index with its site's message."""

    kernel: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    group: int
    sites: tuple[IndexSite, ...] = ()

    @property
    def label(self) -> str:
        return f"kernel {self.kernel} (group {self.group})"

    def index_message(self, site: int, value: int) -> str:
        """What this step's status word (``site`` + 1, ``value``) reports."""
        if not 0 <= site < len(self.sites):
            return f"{self.label} reported index check {site}, but has {len(self.sites)}"
        return self.sites[site].message(value)


@dataclass(frozen=True, slots=True)
class HostStep:
    """Run an opaque primitive's numpy ``evaluate`` on the host."""

    primitive: Primitive
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    group: int
    node: str

    @property
    def label(self) -> str:
        return f"host step {self.primitive.name} ({self.node}, group {self.group})"


Step = Union[KernelStep, HostStep]


@dataclass(frozen=True, slots=True)
class MemoryReport:
    arena_bytes: int
    intermediate_bytes: int  # the arena buffers' sizes summed: what no reuse would take

    def __str__(self) -> str:
        saved = 1 - self.arena_bytes / self.intermediate_bytes if self.intermediate_bytes else 0.0
        return f"arena {self.arena_bytes} B for {self.intermediate_bytes} B of buffers ({saved:.0%} saved by reuse)"


@dataclass(eq=False)
class Plan:
    """An executable plan. ``buffers[i].id == i``; ``weights`` maps each constant
    buffer's name to its data (contiguous, exactly its dtype and shape)."""

    target: str
    source_sha256: str
    tilefuse_version: str
    buffers: tuple[Buffer, ...]
    inputs: tuple[Binding, ...]
    outputs: tuple[Binding, ...]
    kernels: dict[str, Kernel]
    steps: tuple[Step, ...]
    arena_bytes: int
    weights: dict[str, np.ndarray] = field(repr=False)
    source_path: str = ""  # the model compiled, as given (for `tilefuse run --check`)

    def input_types(self) -> list[tuple[str, TensorType]]:
        return [(b.name, self.buffers[b.buffer].type) for b in self.inputs]

    def output_types(self) -> list[tuple[str, TensorType]]:
        return [(b.name, self.buffers[b.buffer].type) for b in self.outputs]

    def checked_steps(self) -> list[int]:
        """The steps that take a status word, in order: step ``checked_steps()[k]`` gets
        status word k of the run."""
        return [i for i, s in enumerate(self.steps) if isinstance(s, KernelStep) and s.sites]

    def memory_report(self) -> MemoryReport:
        total = sum(b.nbytes for b in self.buffers if b.kind.in_arena)
        return MemoryReport(self.arena_bytes, total)

    def save(self, path: str | Path) -> Path:
        """Write the plan as a ``.tfplan`` directory (replacing an older plan there)."""
        from tilefuse.plan.files import save_plan

        return save_plan(self, Path(path))

    def __str__(self) -> str:
        kernels = sum(isinstance(s, KernelStep) for s in self.steps)
        host = len(self.steps) - kernels
        return (
            f"plan for {self.target}: {len(self.steps)} steps ({kernels} kernel, {host} host), "
            f"{len(self.kernels)} kernels, {len(self.weights)} weights; {self.memory_report()}"
        )
