"""`export-ort`: a model whose fused groups are tilefuse kernels that onnxruntime runs.

The pipeline, one way: load the model, name its nodes, decide per node whether tilefuse
claims it (``segment``), compile each convex region of claimed nodes into a Plan with
the ordinary compiler (a value an earlier region folded to a constant, such as shape
arithmetic on the bound shapes, enters later regions as an initializer, so they fold on
through it as the whole model would), then stitch: every kernel step of a plan becomes one node
(``EPContext`` for the plugin execution provider, whose ``source`` names the CPU or the
CUDA provider; ``ai.tilefuse::FusedKernel``, or
``FusedKernelCuda`` for CUDA kernels, for the custom-op library) whose inputs and outputs
are named values of the new model; the plan's constants become initializers; kept nodes
stay as they were. Written beside the model: the kernels (``kernels/NAME.so`` or
``.cubin``, and the descriptor ``kernels/NAME.tfk`` that the C libraries read: see
csrc/tf_kernel.h) and the weights (``model.weights``, ONNX external data).

A node stays with onnxruntime when tilefuse has no converter for it, when it would run
as a tilefuse host step (an opaque primitive such as TopK, or an If whose condition is
known only at run time, which onnxruntime runs natively), when it reads a value from
onnxruntime whose shape is not static (data-dependent) or needs a value at compile time
that only onnxruntime computes, or when its region cannot be converted; the result lists
each one with its reason. Inputs bound with ``consts`` become initializers first, so an
If on them compiles as the branch taken.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tilefuse import backends
from tilefuse.compiler import compile_graph
from tilefuse.errors import (
    ConversionError,
    ShapeError,
    TilefuseError,
    UnsupportedOpError,
)
from tilefuse.frontend import import_onnx
from tilefuse.frontend.context import TO_ONNX_DTYPE, NotConstantError, graph_inputs_behind
from tilefuse.frontend.importer import ModelLike
from tilefuse.frontend.loader import (
    check_model,
    load_model,
    upgrade_opset,
    without_weights,
)
from tilefuse.frontend.precision import precision_target, with_precision
from tilefuse.frontend.scope import op_types
from tilefuse.frontend.shapes import (CONSTS_FORM, ConstSpec, ShapeSpec, as_mapping, bind_constants, bind_input_types,
                                     constant_shapes, fixed_size)
from tilefuse.ir.control import Branch
from tilefuse.ir.graph import Node
from tilefuse.ir.prims.base import Kind
from tilefuse.ir.types import TensorType
from tilefuse.ort.segment import (
    KeptNode,
    name_nodes,
    node_reads,
    regions,
    unsupported_nodes,
)
from tilefuse.ort.stitch import KERNELS_DIR, Stitcher, assemble
from tilefuse.plan.model import BufferKind, Plan
from tilefuse.target import Target, get_target

MODES = ("ep", "custom-ops")
MODEL_FILE = "model.onnx"
WEIGHTS_FILE = "model.weights"
CUSTOM_OPS_LIBRARY = "libtilefuse_ops.so"
EP_LIBRARY = "libtilefuse_ep.so"  # the plugin execution providers (CPU and CUDA), for --as ep

# ONNX element type and dims: None for a dim, or for all of them, that shape inference left open
ValueType = tuple[int, tuple[int | None, ...] | None]


def _static(t: ValueType | None) -> bool:
    return t is not None and t[1] is not None and all(d is not None for d in t[1])


@dataclass
class ExportResult:
    """What ``export_ort`` wrote."""

    model_path: Path
    mode: str
    target: str
    kernel_nodes: int
    claimed_nodes: int
    kept: list[KeptNode] = field(default_factory=list)
    library: Path | None = None  # the library that runs the kernels (custom-op or provider), copied beside the model
    plans: list[Plan] = field(default_factory=list, repr=False)  # one per region, in order

    def summary(self) -> str:
        lines = [f"{self.model_path}: {self.kernel_nodes} tilefuse kernel node(s) for {self.claimed_nodes} ONNX node(s) "
                 f"({'plugin execution provider' if self.mode == 'ep' else 'custom-op library'}, {self.target})"]
        if self.kept:
            lines.append(f"{len(self.kept)} node(s) stay with onnxruntime:")
            lines += [f"  {k}" for k in self.kept]
        else:
            lines.append("no node stays with onnxruntime")
        if self.library:
            lines.append(f"{'custom-op' if self.mode == 'custom-ops' else 'execution provider'} library: {self.library}")
        return "\n".join(lines)


def export_ort(model: ModelLike, out_dir: str | Path, target: str | Target = "cpu",
               shapes: ShapeSpec | None = None, mode: str = "ep", consts: ConstSpec | None = None, *,
               external_data_dir: str | os.PathLike[str] | None = None, precision: str = "fp32") -> ExportResult:
    """Write ``out_dir/model.onnx`` with tilefuse kernels for onnxruntime (see module doc).

    ``consts`` binds inputs to values known at compile time: they become initializers of
    the exported model, which no longer takes them, and what depends only on them (an If
    on a sample rate) is specialised as ``tilefuse optimize`` specialises it. External
    weights are read from ``external_data_dir`` (default: the model file's folder), as in
    ``tilefuse.compile``; ``precision`` is ``tilefuse.compile``'s too (a float32 model's
    kernels computing in fp16 or bf16, inputs and outputs keeping their dtypes)."""
    if mode not in MODES:
        raise TilefuseError(f"--as must be one of {MODES}, got {mode!r}")
    target = precision_target(get_target(target) if isinstance(target, str) else target, precision)
    cuda = backends.for_target(target).on_gpu
    work = _load(model, external_data_dir)
    consts = as_mapping(consts, "consts", CONSTS_FORM)
    input_types = bind_input_types(work, constant_shapes(work, shapes, consts))
    frozen = bind_constants(input_types, consts)
    _freeze_inputs(work, frozen)
    input_types = {name: t for name, t in input_types.items() if name not in frozen}
    types = _value_types(work, input_types)
    kept = unsupported_nodes(work)  # node name -> why onnxruntime runs it; grows while compiling
    compiled = _compile_regions(work, kept, types, target, precision)
    out = Path(out_dir)
    _clear(out)
    stitcher = Stitcher(out, mode, cuda)
    for r, plan in enumerate(compiled):
        stitcher.add_plan(r, plan)
    proto = assemble(work, kept, stitcher, mode)
    out.mkdir(parents=True, exist_ok=True)
    onnx.save_model(proto, str(out / MODEL_FILE), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=WEIGHTS_FILE, size_threshold=1024)
    # the library that runs the kernels, beside them: a server needs onnxruntime and this
    # folder only (no C compiler, no tilefuse)
    from tilefuse.ort.build import library as build_library

    library = out / (CUSTOM_OPS_LIBRARY if mode == "custom-ops" else EP_LIBRARY)
    shutil.copyfile(build_library("custom-ops" if mode == "custom-ops" else "ep"), library)
    _readable(out)
    kept_nodes = [KeptNode(n.name, n.op_type, n.domain, kept[n.name]) for n in work.graph.node if n.name in kept]
    claimed = len(work.graph.node) - len(kept)
    return ExportResult(out / MODEL_FILE, mode, target.name, stitcher.kernel_nodes, claimed, kept_nodes, library,
                        compiled)


def _readable(out: Path) -> None:
    """Every file of the export readable by all (as the umask allows), libraries also
    executable: the folder is deployed to servers whose runtime user is not the exporter
    (onnx writes the weights 0600)."""
    mask = os.umask(0)
    os.umask(mask)
    for path in out.rglob("*"):
        if path.is_file() and not path.is_symlink():
            mode = 0o755 if path.suffix in (".so", ".cubin") else 0o644
            os.chmod(path, mode & ~mask | 0o600)


# ------------------------------------------------------------------------- loading

def _load(model: ModelLike, external_data_dir: str | os.PathLike[str] | None) -> onnx.ModelProto:
    proto = load_model(model, external_data_dir)
    check_model(proto)
    work = onnx.ModelProto()
    work.CopyFrom(upgrade_opset(proto))
    name_nodes(work)
    return work


def _freeze_inputs(work: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> None:
    """Turn the inputs bound to values into initializers (in place)."""
    kept = [vi for vi in work.graph.input if vi.name not in values]
    del work.graph.input[:]
    work.graph.input.extend(kept)
    work.graph.initializer.extend(numpy_helper.from_array(a, name) for name, a in values.items())


def _value_types(work: onnx.ModelProto, input_types: Mapping[str, TensorType]) -> dict[str, ValueType]:
    """Element type and dims of every value onnx's shape inference can type."""
    m = without_weights(work, input_types)
    try:
        m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:  # noqa: BLE001 - onnx raises bare C++ errors; region inputs then stay open
        pass
    types: dict[str, ValueType] = {}
    for vi in (*m.graph.input, *m.graph.value_info, *m.graph.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            tt = vi.type.tensor_type
            dims = tuple(fixed_size(d) for d in tt.shape.dim)  # -1 is dynamic, as onnxruntime reads it
            types[vi.name] = (tt.elem_type, dims if tt.HasField("shape") else None)
    for init in work.graph.initializer:
        types[init.name] = (init.data_type, tuple(init.dims))
    for name, t in input_types.items():
        types[name] = (TO_ONNX_DTYPE[t.dtype], tuple(t.shape))
    return types


# ------------------------------------------------------------------------- compiling

def _compile_regions(work: onnx.ModelProto, kept: dict[str, str], types: dict[str, ValueType],
                     target: Target, precision: str = "fp32") -> list[Plan]:
    """A plan per region, in region order. A node moves to ``kept`` (and the regions are
    formed again) when tilefuse cannot convert it, would run it on the host, or it reads
    a value from onnxruntime whose shape is not static. Each round moves a node, so this
    ends; plans of regions that did not change are reused."""
    consumers = _consumers(work)
    outputs = {o.name for o in work.graph.output}
    cache: dict[tuple[tuple[str, ...], tuple[str, ...]], Plan] = {}
    for _ in range(len(work.graph.node) + 1):
        known = dict(types)  # grows by each region's outputs, as the plans type them
        folded: dict[str, np.ndarray] = {}  # region outputs the frontend folded to constants
        plans: list[Plan] = []
        moved: dict[str, str] = {}
        for region in regions(work, kept):
            plan, moved = _compile_region(work, region, consumers, outputs, known, folded, target, cache, precision)
            if moved:
                break
            if plan is not None:
                plans.append(plan)
                for name, t in plan.output_types():
                    known[name] = (TO_ONNX_DTYPE[t.dtype], tuple(t.shape))
                folded.update(_constant_outputs(plan))
        if not moved:
            return plans
        kept.update(moved)
    raise TilefuseError("export-ort: the regions did not settle (a bug: each round should keep one more node)")


def _compile_region(work: onnx.ModelProto, region: list[onnx.NodeProto], consumers: dict[str, set[str]],
                    graph_outputs: set[str], known: dict[str, ValueType], folded: Mapping[str, np.ndarray],
                    target: Target, cache: dict[tuple[tuple[str, ...], tuple[str, ...]], Plan],
                    precision: str = "fp32") -> tuple[Plan | None, dict[str, str]]:
    """The region's plan (None if nothing outside reads it), or the nodes to keep instead.

    A value an earlier region folded to a constant (shape arithmetic on bound shapes:
    ``Shape -> Gather -> Concat``) comes in as an initializer, not an input, so the
    frontend folds on through it here as it would in the whole model."""
    members = {n.name for n in region}
    produced = {o for n in region for o in n.output if o}
    inits = {t.name: t for t in work.graph.initializer}
    outer = [x for x in dict.fromkeys(name for n in region for name in node_reads(n))
             if x not in produced and x not in inits]
    constants = [x for x in outer if x in folded]
    reads = [x for x in outer if x not in folded]
    key = (tuple(n.name for n in region), tuple(constants))
    if key in cache:
        return cache[key], {}
    outs = [o for n in region for o in n.output if o and (o in graph_outputs or consumers.get(o, set()) - members)]
    if not outs:
        return None, {}
    unknown = {x for x in reads if not _static(known.get(x))}
    if unknown:
        why = "reads {}, whose shape onnx's shape inference leaves open (data-dependent?)"
        return None, {n.name: why.format(next(x for x in node_reads(n) if x in unknown))
                      for n in region if unknown & set(node_reads(n))}
    g = helper.make_graph(
        list(region), f"{work.graph.name or 'model'}_region",
        [helper.make_tensor_value_info(x, known[x][0], list(known[x][1] or ())) for x in reads],
        [_declared_output(o, known.get(o)) for o in outs],
        [inits[x] for x in dict.fromkeys(x for n in region for x in node_reads(n)) if x in inits]
        + [numpy_helper.from_array(np.asarray(folded[x]), x) for x in constants],
    )
    sub = helper.make_model(g, opset_imports=list(work.opset_import))
    sub.ir_version = work.ir_version
    try:
        graph = with_precision(import_onnx(sub, check_shapes=False), precision)
    except UnsupportedOpError as e:
        return None, {label.split("/", 1)[0]: f"not convertible here: {op}" for op in e.ops for label in op.nodes}
    except NotConstantError as e:
        # One node needs a value that is known only at run time here (the region's
        # input, computed by onnxruntime): that node stays there, the others compile.
        top = e.node.split("/", 1)[0]
        if top in members:
            return None, {top: f"needs a value known at compile time: {str(e).splitlines()[0]}"}
        return None, {n.name: f"region not convertible: {str(e).splitlines()[0]}" for n in region}
    except (ConversionError, ShapeError) as e:
        # tilefuse cannot take this region as it is (a shape it cannot bind, a converter
        # refusing these attributes): its nodes stay with onnxruntime, with the reason.
        return None, {n.name: f"region not convertible: {str(e).splitlines()[0]}" for n in region}
    host = {n.origin: _host_reason(n) for n in graph.nodes if n.op.kind is Kind.OPAQUE}
    if host:
        return None, host
    plan = compile_graph(graph, target, "", len(region), onnx_ops=op_types(sub.graph)).plan
    plan.precision = precision
    cache[key] = plan
    return plan, {}


def _host_reason(node: Node) -> str:
    if isinstance(node.op, Branch):
        deps = graph_inputs_behind(node.inputs[0])
        return (f"an If on a condition known only at run time (from {deps}), so onnxruntime runs it; "
                f"bind those inputs (--const) to compile the branch taken")
    return f"tilefuse would run it on the host ({type(node.op).__name__}), so onnxruntime does"


def _constant_outputs(plan: Plan) -> dict[str, np.ndarray]:
    """The plan's outputs that are constants (folded at import), by name."""
    return {b.name: plan.weights[plan.buffers[b.buffer].name] for b in plan.outputs
            if plan.buffers[b.buffer].kind is BufferKind.CONSTANT}


def _declared_output(name: str, t: ValueType | None) -> onnx.ValueInfoProto:
    """A region output as far as onnx knows it. The checker insists on a shape; where
    the rank is unknown a scalar stands in: tilefuse types outputs itself and checks only
    the element type declared (float when unknown, and a wrong guess keeps the region
    on onnxruntime with the frontend's reason)."""
    elem, dims = t if t is not None else (onnx.TensorProto.FLOAT, None)
    return helper.make_tensor_value_info(name, elem, list(dims) if dims is not None else [])


def _consumers(work: onnx.ModelProto) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for node in work.graph.node:
        for name in node_reads(node):
            out.setdefault(name, set()).add(node.name)
    return out


def _clear(out: Path) -> None:
    """Remove what an earlier export wrote (external data is appended to, never replaced)."""
    for f in (MODEL_FILE, WEIGHTS_FILE, CUSTOM_OPS_LIBRARY):
        (out / f).unlink(missing_ok=True)
    folder = out / KERNELS_DIR
    if folder.is_dir():
        for path in folder.iterdir():
            if path.suffix in (".tfk", ".so", ".cubin"):
                path.unlink()
