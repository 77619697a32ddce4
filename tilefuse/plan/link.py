"""Linking: a partition and its compiled kernels -> an executable Plan.

Every value that crosses a group boundary becomes a numbered buffer: graph inputs and
constants keep their own storage, values written by steps go to the arena. Kernel
groups become kernel steps whose arguments are the group's inputs then its outputs;
opaque groups become one host step per primitive, and a Branch (an If on a run-time
condition) its two branches' steps between a BranchStep and a SelectStep. Values inside
a kernel group never get a buffer: they live in the kernel's registers and tiles.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from tilefuse.codegen.artifact import KernelArtifact
from tilefuse.errors import PlanError
from tilefuse.ir.control import Branch
from tilefuse.ir.graph import Graph, Node, Value
from tilefuse.partition.cost import Cost
from tilefuse.partition.kinds import FusionKind
from tilefuse.partition.model import FusedGroup, Partition
from tilefuse.plan.files import sha256_file
from tilefuse.plan.hostops import primitive_to_json
from tilefuse.plan.memory import plan_memory
from tilefuse.plan.model import (Binding, BranchStep, Buffer, BufferKind, HostStep, IndexSite, Kernel, KernelStep,
                                  Plan, SelectStep, Step, StepFacts)
from tilefuse.plan.verify import check_kernel_identity, verify_plan
from tilefuse.target import Target


@dataclass(frozen=True, eq=False)
class GraphCode:
    """What linking needs of one compiled graph: its partition, the artifact of each
    kernel group, the values bound to each kernel's params (see ``link``), and for each
    run-time branch (keyed by ``id`` of its Branch node) the GraphCode of both branches."""

    partition: Partition
    kernels: Mapping[int, KernelArtifact]
    bindings: Mapping[int, Sequence[Value]] | None = None
    branches: Mapping[int, tuple["GraphCode", "GraphCode"]] = field(default_factory=dict)
    sites: Mapping[int, Sequence[IndexSite]] = field(default_factory=dict)  # a checking kernel's index checks
    schedules: Mapping[int, dict] = field(default_factory=dict)  # each kernel's schedule record, as JSON data


def link(
    graph: Graph,
    partition: Partition,
    kernels: Mapping[int, KernelArtifact],
    target_name: str,
    source_sha256: str,
    bindings: Mapping[int, Sequence[Value]] | None = None,
    branches: Mapping[int, tuple[GraphCode, GraphCode]] | None = None,
    sites: Mapping[int, Sequence[IndexSite]] | None = None,
    schedules: Mapping[int, dict] | None = None,
    onnx_ops: Mapping[str, str] | None = None,
) -> Plan:
    """Build the plan; ``kernels[group.id]`` is the artifact of each non-opaque group.

    ``bindings[group.id]``, when given, are the values bound to the kernel's params in
    order (inputs, then the group's outputs): lowering may fold scalar constants into
    the kernel and bind no param to them. Without it, params are the group's inputs then
    outputs. ``branches`` holds the compiled branches of each Branch node (an If on a
    run-time condition): both are laid out as steps between a BranchStep and a
    SelectStep. ``sites[group.id]`` are the index checks of a kernel that takes a status
    word (its last param). ``schedules[group.id]`` is the JSON form of the schedule record
    its lowering made (``Kernel.schedule``; absent: none recorded). ``onnx_ops`` maps ONNX
    node names (``Node.origin``) to their op types, for each step's ``StepFacts`` (with
    the group's cost on the partition's target). PlanError if a kernel
    is missing, its params disagree with its values or sites, or two artifacts claim one
    name with different files.
    """
    import tilefuse

    linker = _Linker(graph, target_name, onnx_ops or {})
    linker.graph_steps(GraphCode(partition, kernels, bindings, branches or {}, sites or {}, schedules or {}))
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

    def __init__(self, graph: Graph, target: str, onnx_ops: Mapping[str, str]) -> None:
        self.target = target
        self.onnx_ops = onnx_ops
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

    def graph_steps(self, code: GraphCode) -> None:
        """The steps of a graph's groups, in order (the graph's inputs have buffers)."""
        for group in code.partition.groups:
            if group.kind is FusionKind.OPAQUE:
                for node in group.nodes:
                    if isinstance(node.op, Branch):
                        self.branch(group, node, code.branches)
                    else:
                        self.host_step(group, node, self.facts([node.origin] if node.origin else []))
            elif group.id not in code.kernels:
                raise PlanError(f"no kernel for group {group.id} ({group.name})")
            else:
                bindings = code.bindings
                values = tuple(bindings[group.id]) if bindings and group.id in bindings else group.inputs + group.outputs
                self.kernel_step(group, code.kernels[group.id], values, tuple(code.sites.get(group.id, ())),
                                 dict(code.schedules.get(group.id, {})),
                                 self.facts(group.onnx_nodes, group.cost, code.partition.target))

    def facts(self, nodes: Sequence[str], cost: Cost | None = None, target: Target | None = None) -> StepFacts:
        """A step's facts: its ONNX nodes and their op types; with ``cost``, its estimate
        and roofline floor on ``target``."""
        ops = tuple(dict.fromkeys(self.onnx_ops[n] for n in nodes if n in self.onnx_ops))
        if cost is None or target is None:
            return StepFacts(tuple(nodes), ops)
        floor = max(cost.compute_seconds(target), cost.memory_seconds(target))
        return StepFacts(tuple(nodes), ops, cost.seconds(target), floor, cost.flops, cost.bytes, cost.bound(target))

    def host_step(self, group: FusedGroup, node: Node, facts: StepFacts) -> None:
        what = f"host step {node.name} (group {group.id})"
        primitive_to_json(node.op)  # fails early, at link time, for a primitive no plan can name
        ins = tuple(self.read(v, what) for v in node.inputs)
        outs = tuple(self.write(v, what) for v in node.outputs)
        self.steps.append(HostStep(node.op, ins, outs, group.id, node.name, facts))

    def branch(self, group: FusedGroup, node: Node, branches: Mapping[int, tuple[GraphCode, GraphCode]]) -> None:
        """BranchStep, the then-graph's steps, the else-graph's, SelectStep."""
        what = f"branch {node.name} (group {group.id})"
        if id(node) not in branches:
            raise PlanError(f"{what}: its branches were not compiled")
        op = node.op
        assert isinstance(op, Branch), "a branch group holds a Branch node"
        cond = self.read(node.inputs[0], what)
        outer = [self.read(v, what) for v in node.inputs[1:]]
        at = len(self.steps)
        self.steps.append(BranchStep(cond, 0, 0, group.id, node.name))  # its counts are known below
        results = []
        for g, code in zip((op.then_graph, op.else_graph), branches[id(node)]):
            for v, b in zip(g.inputs, outer, strict=True):
                self.ids[id(v)] = b  # the branch's inputs are the outer values' buffers
            self.graph_steps(code)
            results.append((len(self.steps), tuple(self.read(v, f"{what}: {g.name}") for v in g.outputs.values())))
        (middle, then_values), (end, else_values) = results
        self.steps[at] = BranchStep(cond, middle - at - 1, end - middle, group.id, node.name)
        outs = tuple(self.write(v, what) for v in node.outputs)
        self.steps.append(SelectStep(cond, then_values, else_values, outs, group.id, node.name))

    def kernel_step(self, group: FusedGroup, artifact: KernelArtifact, values: tuple[Value, ...],
                    sites: tuple[IndexSite, ...], schedule: dict, facts: StepFacts) -> None:
        what = f"kernel {artifact.name} (group {group.id})"
        if tuple(map(id, values[len(values) - len(group.outputs):])) != tuple(map(id, group.outputs)):
            raise PlanError(f"{what}: the bound values must end with the group's outputs")
        inputs = values[: len(values) - len(group.outputs)]
        _check_params(inputs, group.outputs, bool(sites), artifact, what)
        kernel = self._kernel(artifact, what, schedule)
        ins = tuple(self.read(v, what) for v in inputs)
        outs = tuple(self.write(v, what) for v in group.outputs)
        self.steps.append(KernelStep(kernel.name, ins, outs, group.id, sites, facts))

    def _kernel(self, artifact: KernelArtifact, what: str, schedule: dict) -> Kernel:
        path = Path(artifact.path)
        launch = artifact.launch
        kernel = Kernel(artifact.name, artifact.symbol, path, "", launch, tuple(artifact.params))
        try:  # its name names its file in the plan and gives its entry symbol
            check_kernel_identity(kernel, self.target)
        except PlanError as e:
            raise PlanError(f"{what}: {e}") from None
        if not path.is_file():
            raise PlanError(f"{what}: kernel file {path} does not exist")
        kernel = Kernel(artifact.name, artifact.symbol, path, sha256_file(path), launch, tuple(artifact.params), schedule)
        known = self.kernels.setdefault(kernel.name, kernel)
        if known is not kernel and (known.sha256, known.symbol, known.params) != (kernel.sha256, kernel.symbol, kernel.params):
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
        value_is = (str(v.type.dtype), v.type.shape, role)
        param_is = (p.dtype, tuple(p.shape), p.role)
        if value_is != param_is:
            raise PlanError(f"{what}: param {i} ({p.name}) is {param_is}, but {v.name} is {value_is}")
