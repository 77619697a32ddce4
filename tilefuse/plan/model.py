"""The in-memory plan: buffers, kernels, steps, the arena and the weights.

A Plan is what ``link`` builds from a partition and its kernels, what ``load_plan``
reads back from a ``.tfplan`` directory and what a runtime executes. It holds no graph:
every tensor the steps touch is a numbered Buffer, every step names buffers by id.
"""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence, Union

import numpy as np

from tilefuse.codegen.artifact import ParamSpec
from tilefuse.codegen.launch import LaunchRecord
from tilefuse.ir.prims import Primitive
from tilefuse.ir.types import TensorType

FORMAT_VERSION = 2  # 2: weights.safetensors is hashed in the manifest
ALIGN = 64  # bytes: arena offsets and the arena base; a cache line, an AVX-512 vector

# A kernel's name as the code generators make it: a stem naming its ops (letters, digits,
# underscores: codegen/toolchain.kernel_stem), "_" and ten hex digits of a content hash.
# It is the kernel's file name in a plan and its entry symbol derives from it, so a
# manifest can name no other file and no other function (``abort``, ``free``, ...).
KERNEL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}_[0-9a-f]{10}")


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
    """A compiled kernel as the plan knows it; ``path`` is where its file is now;
    ``launch`` is its family's record (``codegen/launch.py``). ``schedule`` is what its
    lowering chose, as JSON data: ``{"family": "gemm", "tile_m": 64, ...}`` (the
    ``to_json`` of its ``tile_ir/schedule.py`` record), for people and for tools; nothing
    at load or run time depends on it. Empty where unknown (hand-built kernels, plans
    written before it was recorded)."""

    name: str
    symbol: str
    path: Path
    sha256: str
    launch: LaunchRecord
    params: tuple[ParamSpec, ...]
    schedule: dict = field(default_factory=dict, repr=False)

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
class StepFacts:
    """What the compiler knew of a step, for profiles and people; nothing at load or run
    time depends on it. ``onnx_nodes`` are the ONNX nodes the step computes (part of),
    ``onnx_ops`` their op types where known, in first-seen order. The estimate is the
    partitioner's cost model on the plan's target (``partition/cost.py``: the roofline
    plus a launch); the floor is the roofline alone, the larger of ``flops`` at the
    device's peak rate and ``bytes`` at its bandwidth. Host steps carry nodes only (None:
    the cost model prices device kernels)."""

    onnx_nodes: tuple[str, ...] = ()
    onnx_ops: tuple[str, ...] = ()
    estimated_seconds: float | None = None
    floor_seconds: float | None = None
    flops: int | None = None
    bytes: int | None = None
    bound: str = ""  # "compute" | "memory"; "" where unpriced


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
    facts: StepFacts | None = None  # None: plans written before they were recorded

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
    facts: StepFacts | None = None

    @property
    def label(self) -> str:
        return f"host step {self.primitive.name} ({self.node}, group {self.group})"


@dataclass(frozen=True, slots=True)
class BranchStep:
    """Where an ONNX If on a run-time condition starts: if ``cond`` (one bool) is true,
    run the ``then_steps`` steps after this one and skip the ``else_steps`` after those;
    else skip the first and run the second. A SelectStep follows both.

    Both branches are laid out in the one step list and share the arena: liveness is
    planned over the list as written, which holds for any path through it, since the
    steps of a path are a subsequence of the list."""

    cond: int
    then_steps: int
    else_steps: int
    group: int
    node: str

    @property
    def inputs(self) -> tuple[int, ...]:
        return (self.cond,)

    @property
    def outputs(self) -> tuple[int, ...]:
        return ()

    @property
    def label(self) -> str:
        return f"branch {self.node} (group {self.group})"


@dataclass(frozen=True, slots=True)
class SelectStep:
    """Where a branch joins: copy ``then_values`` (``cond`` true) or ``else_values`` into
    ``outputs``. It reads ``cond`` again rather than remember which branch ran, and reads
    both branches' values, so that they stay live (and unshared) until here."""

    cond: int
    then_values: tuple[int, ...]
    else_values: tuple[int, ...]
    outputs: tuple[int, ...]
    group: int
    node: str

    @property
    def inputs(self) -> tuple[int, ...]:
        return (self.cond, *self.then_values, *self.else_values)

    @property
    def label(self) -> str:
        return f"select {self.node} (group {self.group})"

    def chosen(self, cond: bool) -> tuple[int, ...]:
        return self.then_values if cond else self.else_values


Step = Union[KernelStep, HostStep, BranchStep, SelectStep]


def step_order(steps: Sequence[Step], test: Callable[[BranchStep], bool], start: int = 0,
               stop: int | None = None) -> Iterator[int]:
    """The indices of the steps a run executes, in order: each BranchStep's ``test`` picks
    its branch when the walk reaches it (lazily, so a runtime can run the steps before it
    first, and read the condition they computed)."""
    i, stop = start, len(steps) if stop is None else stop
    while i < stop:
        step = steps[i]
        yield i
        if isinstance(step, BranchStep):
            first = i + 1
            middle = first + step.then_steps
            end = middle + step.else_steps
            yield from step_order(steps, test, first, middle) if test(step) else step_order(steps, test, middle, end)
            i = end
        else:
            i += 1


@dataclass(frozen=True, slots=True)
class MemoryReport:
    arena_bytes: int
    intermediate_bytes: int  # the arena buffers' sizes summed: what no reuse would take

    def __str__(self) -> str:
        saved = 1 - self.arena_bytes / self.intermediate_bytes if self.intermediate_bytes else 0.0
        return f"arena {self.arena_bytes} B for {self.intermediate_bytes} B of buffers ({saved:.0%} saved by reuse)"


PRECISIONS = ("fp32", "tf32", "fp16", "bf16")  # a plan's arithmetic, as frontend.precision names them


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
    # the arithmetic the plan was compiled for (``compile(precision=...)``); `tilefuse run
    # --check` takes its tolerance from it, whatever dtype the outputs have
    precision: str = "fp32"
    # what the plan was built with: the Target's every field (device, policies, codegen
    # options) as JSON data, and its sha256 (``Target.fingerprint``); empty where unknown
    target_spec: dict = field(default_factory=dict, repr=False)
    target_fingerprint: str = ""
    # the CPU extensions its kernels may use (tilefuse/cpu_isa.py: a level's, or the build
    # machine's for -march=native), checked against the machine before a kernel is loaded
    cpu_requires: tuple[str, ...] = ()

    def input_types(self) -> list[tuple[str, TensorType]]:
        return [(b.name, self.buffers[b.buffer].type) for b in self.inputs]

    def output_types(self) -> list[tuple[str, TensorType]]:
        return [(b.name, self.buffers[b.buffer].type) for b in self.outputs]

    def checked_steps(self) -> list[int]:
        """The steps that take a status word, in order: step ``checked_steps()[k]`` gets
        status word k of the run."""
        return [i for i, s in enumerate(self.steps) if isinstance(s, KernelStep) and s.sites]

    def status_message(self, status: np.ndarray) -> str:
        """What a run's status words (``[len(checked_steps()), 2]``, some row non-zero)
        report: the first checking step's out-of-range index."""
        k = int(np.flatnonzero(status[:, 0])[0])
        step = self.steps[self.checked_steps()[k]]
        assert isinstance(step, KernelStep)  # checked_steps lists kernel steps only
        return step.index_message(int(status[k, 0]) - 1, int(status[k, 1]))

    def memory_report(self) -> MemoryReport:
        total = sum(b.nbytes for b in self.buffers if b.kind.in_arena)
        return MemoryReport(self.arena_bytes, total)

    def save(self, path: str | Path) -> Path:
        """Write the plan as a ``.tfplan`` directory (replacing an older plan there)."""
        from tilefuse.plan.files import save_plan

        return save_plan(self, Path(path))

    def __str__(self) -> str:
        kernels = sum(isinstance(s, KernelStep) for s in self.steps)
        branches = sum(isinstance(s, BranchStep) for s in self.steps)
        host = sum(isinstance(s, HostStep) for s in self.steps)
        flow = f", {branches} branch" if branches else ""
        return (
            f"plan for {self.target}: {len(self.steps)} steps ({kernels} kernel, {host} host{flow}), "
            f"{len(self.kernels)} kernels, {len(self.weights)} weights; {self.memory_report()}"
        )
