"""Linking: a partition and its compiled kernels -> an executable Plan.

Every value that crosses a group boundary becomes a numbered buffer: graph inputs and
constants keep their own storage, values written by steps go to the arena. Kernel
groups become kernel steps whose arguments are the group's inputs then its outputs;
opaque groups become one host step per primitive. Values inside a kernel group never
get a buffer: they live in the kernel's registers and tiles.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from tilefuse.codegen.artifact import KernelArtifact
from tilefuse.errors import PlanError
from tilefuse.ir.graph import Graph, Value
from tilefuse.partition.kinds import FusionKind
from tilefuse.partition.model import FusedGroup, Partition
from tilefuse.plan.files import sha256_file
from tilefuse.plan.hostops import primitive_to_json
from tilefuse.plan.memory import plan_memory
from tilefuse.plan.model import Binding, Buffer, BufferKind, HostStep, IndexSite, Kernel, KernelStep, Plan, Step
from tilefuse.plan.verify import verify_plan

_KERNEL_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def link(
    graph: Graph,
    partition: Partition,
    kernels: Mapping[int, KernelArtifact],
    target_name: str,
    source_sha256: str,
    bindings: Mapping[int, Sequence[Value]] | None = None,
    sites: Mapping[int, Sequence[IndexSite]] | None = None,
) -> Plan:
    """Build the plan; ``kernels[group.id]`` is the artifact of each non-opaque group.

    ``bindings[group.id]``, when given, are the values bound to the kernel's params in
    order (inputs, then the group's outputs): lowering may fold scalar constants into
    the kernel and bind no param to them. Without it, params are the group's inputs then
    outputs. ``sites[group.id]`` are the index checks of a kernel that takes a status
    word (its last param). PlanError if a kernel is missing, its params disagree with its
    values or sites, or two artifacts claim one name with different files.
    """
    import tilefuse

    linker = _Linker(graph)
    for group in partition.groups:
        if group.kind is FusionKind.OPAQUE:
            linker.host_steps(group)
        elif group.id not in kernels:
            raise PlanError(f"no kernel for group {group.id} ({group.name})")
        else:
            values = tuple(bindings[group.id]) if bindings and group.id in bindings else group.inputs + group.outputs
            checks = tuple(sites[group.id]) if sites and group.id in sites else ()
            linker.kernel_step(group, kernels[group.id], values, checks)
    outputs = tuple(Binding(name, linker.read(v, f"graph output {name!r}")) for name, v in graph.outputs.items())
    buffers, arena = plan_memory(linker.buffers, linker.steps)
    plan = Plan(
        target=target_name,
        source_sha256=source_sha256,
        tilefuse_version=tilefuse.__version__,
        buffers=tuple(buffers),
        inputs=tuple(Binding(v.name, linker.ids[id(v)]) for v in graph.inputs),
        outputs=outputs,
        kernels=linker.kernels,
        steps=tuple(linker.steps),
        arena_bytes=arena,
        weights=linker.weights,
    )
    verify_plan(plan)
    return plan


class _Linker:
    """Assigns buffers to values and appends steps, in group order."""

    def __init__(self, graph: Graph) -> None:
        self.outputs = {id(v) for v in graph.outputs.values()}
        self.buffers: list[Buffer] = []
        self.ids: dict[int, int] = {}  # id(value) -> buffer id
        self.names: set[str] = set()
        self.steps: list[Step] = []
        self.kernels: dict[str, Kernel] = {}
        self.weights: dict[str, np.ndarray] = {}
        for v in graph.inputs:
            self._new(v, BufferKind.INPUT)

    def _new(self, v: Value, kind: BufferKind) -> int:
        # Value names are unique in graphs built by the Builder; keep buffer names unique
        # anyway, since constants are keyed by name in weights.safetensors.
        name = v.name if v.name not in self.names else f"{v.name}#{len(self.buffers)}"
        self.names.add(name)
        buf = Buffer(len(self.buffers), name, kind, v.type)
        self.buffers.append(buf)
        self.ids[id(v)] = buf.id
        if kind is BufferKind.CONSTANT:
            assert v.data is not None
            # np.require, not ascontiguousarray: that one turns 0-d arrays into 1-d.
            self.weights[name] = np.require(v.data, v.type.dtype.numpy, "C")
        return buf.id

    def read(self, v: Value, reader: str) -> int:
        if id(v) in self.ids:
            return self.ids[id(v)]
        if v.is_constant:
            return self._new(v, BufferKind.CONSTANT)
        raise PlanError(f"{reader} reads {v.name}, which no earlier step writes (partition out of order?)")

    def write(self, v: Value, writer: str) -> int:
        if id(v) in self.ids:
            raise PlanError(f"{writer} writes {v.name}, which has a buffer already")
        return self._new(v, BufferKind.OUTPUT if id(v) in self.outputs else BufferKind.INTERMEDIATE)

    def host_steps(self, group: FusedGroup) -> None:
        for node in group.nodes:
            what = f"host step {node.name} (group {group.id})"
            primitive_to_json(node.op)  # fails early, at link time, for a primitive no plan can name
            ins = tuple(self.read(v, what) for v in node.inputs)
            outs = tuple(self.write(v, what) for v in node.outputs)
            self.steps.append(HostStep(node.op, ins, outs, group.id, node.name))

    def kernel_step(self, group: FusedGroup, artifact: KernelArtifact, values: tuple[Value, ...],
                    sites: tuple[IndexSite, ...]) -> None:
        what = f"kernel {artifact.name} (group {group.id})"
        if tuple(map(id, values[len(values) - len(group.outputs):])) != tuple(map(id, group.outputs)):
            raise PlanError(f"{what}: the bound values must end with the group's outputs")
        inputs = values[: len(values) - len(group.outputs)]
        _check_params(inputs, group.outputs, bool(sites), artifact, what)
        kernel = self._kernel(artifact, what)
        ins = tuple(self.read(v, what) for v in inputs)
        outs = tuple(self.write(v, what) for v in group.outputs)
        self.steps.append(KernelStep(kernel.name, ins, outs, group.id, sites))

    def _kernel(self, artifact: KernelArtifact, what: str) -> Kernel:
        if not _KERNEL_NAME.match(artifact.name):
            raise PlanError(f"{what}: kernel name must match {_KERNEL_NAME.pattern} (it names a file in the plan)")
        path = Path(artifact.path)
        if not path.is_file():
            raise PlanError(f"{what}: kernel file {path} does not exist")
        sha = sha256_file(path)
        try:
            launch = json.loads(json.dumps(dict(artifact.launch)))
        except (TypeError, ValueError) as e:
            raise PlanError(f"{what}: launch data is not JSON-serialisable: {e}") from None
        kernel = Kernel(artifact.name, artifact.symbol, path, sha, launch, tuple(artifact.params))
        known = self.kernels.setdefault(kernel.name, kernel)
        if known is not kernel and (known.sha256, known.symbol, known.params) != (sha, kernel.symbol, kernel.params):
            raise PlanError(f"{what}: two different kernels are both named {kernel.name!r}")
        return known


def _check_params(
    inputs: Sequence[Value], outputs: Sequence[Value], checked: bool, artifact: KernelArtifact, what: str
) -> None:
    """The params must be the bound inputs then the outputs, with their dtypes and shapes,
    then the status word exactly when the kernel has index checks."""
    values = [(v, "input") for v in inputs] + [(v, "output") for v in outputs]
    status = [p for p in artifact.params if p.role == "status"]
    if status != ([artifact.params[-1]] if checked else []):
        want = "one status param, last" if checked else "no status param"
        raise PlanError(f"{what}: {len(status)} status param(s), but a kernel {'with' if checked else 'without'} "
                        f"index checks takes {want}")
    if len(artifact.params) - len(status) != len(values):
        raise PlanError(
            f"{what}: {len(artifact.params)} params, but {len(inputs)} inputs "
            f"and {len(outputs)} outputs are bound"
        )
    for i, (p, (v, role)) in enumerate(zip(artifact.params, values)):
        want = (str(v.type.dtype), v.type.shape, role)
        got = (p.dtype, tuple(p.shape), p.role)
        if want != got:
            raise PlanError(f"{what}: param {i} ({p.name}) is {got}, but {v.name} is {want}")
