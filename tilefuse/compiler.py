"""The whole pipeline as one readable function: ONNX in, an executable Plan out."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from dataclasses import dataclass, field
from typing import Mapping

from tilefuse import backends
from tilefuse.codegen.options import CpuOptions
from tilefuse.errors import TilefuseError
from tilefuse.frontend import import_onnx
from tilefuse.frontend.importer import ModelLike
from tilefuse.frontend.loader import ModelProto, load_model
from tilefuse.frontend.precision import precision_target, with_precision
from tilefuse.cpu_isa import requires
from tilefuse.frontend.scope import op_types
from tilefuse.frontend.shapes import ConstSpec, ShapeSpec
from tilefuse.ir.control import Branch
from tilefuse.ir.graph import Graph
from tilefuse.partition import Partition, partition_graph
from tilefuse.partition.kinds import FusionKind
from tilefuse.plan import IndexSite, Plan, link
from tilefuse.plan.link import GraphCode
from tilefuse.plan.memory import check_fits
from tilefuse.progress import Progress
from tilefuse.target import Target, for_this_machine, get_target, memory_limit
from tilefuse.tile_ir import Lowered, lower_group


@dataclass
class Compiled:
    """Everything one compilation produced, for the CLI and for tests."""

    graph: Graph
    partition: Partition
    lowered: dict[int, Lowered]
    plan: Plan
    onnx_nodes: int
    notes: list[str] = field(default_factory=list)
    onnx_ops: Mapping[str, str] = field(default_factory=dict)  # ONNX node name -> op type


def compile(model: ModelLike, target: str | Target = "cpu", shapes: ShapeSpec | None = None,
            precision: str = "fp32", consts: ConstSpec | None = None, *,
            external_data_dir: str | os.PathLike[str] | None = None) -> Plan:
    """Compile ``model`` for ``target`` into an in-memory Plan (``plan.save(path)``);
    ``precision`` "fp16"/"bf16" runs a float32 model's arithmetic in that type; "tf32" lets
    float32 products round their operands to TF32 on GPU tensor cores. ``consts`` binds
    inputs to values known at compile time ({"sample_rate": 16000}): the plan does not
    take them, and an If on them is specialised to the branch taken. External weights are
    read from ``external_data_dir``, by default the model file's folder; a model given as
    bytes or a ModelProto that has external weights needs it."""
    return compile_model(model, target, shapes, precision, consts, external_data_dir=external_data_dir).plan


def compile_model(model: ModelLike, target: str | Target = "cpu", shapes: ShapeSpec | None = None,
                  precision: str = "fp32", consts: ConstSpec | None = None, *,
                  external_data_dir: str | os.PathLike[str] | None = None,
                  progress: Progress | None = None) -> Compiled:
    """``compile``, keeping every stage's result; ``progress`` hears of each stage and
    kernel (tilefuse.progress)."""
    if not isinstance(target, (str, Target)):
        raise TilefuseError(f"target must be a target name such as 'cpu' or a Target, got {target!r}")
    target = for_this_machine(precision_target(get_target(target) if isinstance(target, str) else target, precision))
    progress = progress or Progress()
    progress.begin("import")
    proto = load_model(model, external_data_dir)
    source_sha = _sha256(model, proto)
    graph = with_precision(import_onnx(proto, shapes, constants=consts, integer_products=target.gemm.integer_products), precision)  # ONNX -> ir.Graph (verified)
    progress.end("import")
    ops = op_types(proto.graph)
    compiled = compile_graph(graph, target, source_sha, len(proto.graph.node), progress, ops)
    compiled.onnx_ops = ops
    compiled.plan.precision = precision
    if isinstance(model, (str, os.PathLike)):
        compiled.plan.source_path = str(Path(model).resolve())
    return compiled


def compile_graph(graph: Graph, target: Target, source_sha: str = "", onnx_nodes: int = 0,
                  progress: Progress | None = None, onnx_ops: Mapping[str, str] | None = None) -> Compiled:
    """Partition, lower, generate code and link an imported graph; ``onnx_ops`` (ONNX node
    name -> op type) names the ops each step covers in its facts."""
    progress = progress or Progress()
    code, lowered = generate(graph, target, progress)
    progress.begin("link")
    plan = link(graph, code.partition, code.kernels, target.name, source_sha, bindings=code.bindings,
                branches=code.branches, sites=code.sites, schedules=code.schedules, onnx_ops=onnx_ops)
    check_fits(plan, *memory_limit(target))
    if target.family == "cpu":  # the extensions its kernels may use, checked where it loads
        assert isinstance(target.codegen, CpuOptions), f"{target.name}: a CPU target emits with CpuOptions"
        plan.cpu_requires = requires(target.codegen.isa)
    progress.end("link")
    plan.target_spec, plan.target_fingerprint = target.spec(), target.fingerprint()
    return Compiled(graph, code.partition, lowered, plan, onnx_nodes)


def generate(graph: Graph, target: Target, progress: Progress | None = None) -> tuple[GraphCode, dict[int, Lowered]]:
    """A graph's partition and kernels, and those of each run-time branch's two graphs
    (compiled on their own, as whole graphs); the TileProgram of each kernel group."""
    progress = progress or Progress()
    progress.begin("partition")
    partition = partition_graph(graph, target)  # -> fusion groups (verified)
    progress.end("partition")
    kernel_groups = [g for g in partition.groups if g.kind is not FusionKind.OPAQUE]
    progress.begin("lower", len(kernel_groups))
    lowered = {}
    for g in kernel_groups:
        lowered[g.id] = lower_group(g, target)  # one TileProgram each (verified)
        progress.step("lower")
    progress.end("lower")
    programs = [lowered[g.id].program for g in kernel_groups]
    progress.begin("build")  # identical kernels build once: how many are distinct shows as they come
    artifacts = backends.for_target(target).build_all(programs, target,
                                                      on_kernel=lambda cached: progress.step("build", cached))
    progress.end("build")
    kernels = {g.id: a for g, a in zip(kernel_groups, artifacts)}
    bindings = {gid: low.bindings for gid, low in lowered.items()}
    sites = {gid: tuple(IndexSite(s.what, s.extent) for s in low.sites) for gid, low in lowered.items()}
    schedules = {gid: low.program.schedule.to_json() for gid, low in lowered.items() if low.program.schedule is not None}
    branches = {id(n): (generate(n.op.then_graph, target)[0], generate(n.op.else_graph, target)[0])
                for g in partition.groups if g.kind is FusionKind.OPAQUE for n in g.nodes if isinstance(n.op, Branch)}
    return GraphCode(partition, kernels, bindings, branches, sites, schedules), lowered


def _sha256(model: ModelLike, proto: ModelProto | None) -> str:
    """The source model's hash: of the file when there is one (no re-serialisation)."""
    if isinstance(model, (str, os.PathLike)):
        h = hashlib.sha256()
        with open(model, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                h.update(chunk)
        return h.hexdigest()
    if isinstance(model, bytes):
        return hashlib.sha256(model).hexdigest()
    assert proto is not None, "a model given as a proto is hashed as load_model read it"
    return hashlib.sha256(proto.SerializeToString(deterministic=True)).hexdigest()

