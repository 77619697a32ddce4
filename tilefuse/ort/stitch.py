"""Stitching: plans of regions -> the nodes, initializers and value_info of the model
onnxruntime runs, and the kernel files those nodes name.

Every kernel step becomes one node whose inputs and outputs are the names of its
buffers: graph inputs and outputs keep their names, the other buffers of region ``r`` are
named ``tilefuse/r<r>/<buffer>``; constants become initializers. Each kernel is copied
beside the model with its descriptor (the format is in csrc/tf_kernel.h). A kernel that
checks indices gets a descriptor per set of check sites (identical layers share a kernel,
but each names its own ONNX nodes), all naming the one library.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tilefuse.codegen.launch import CudaLaunch, KernelArg
from tilefuse.errors import TilefuseError
from tilefuse.frontend.context import TO_ONNX_DTYPE
from tilefuse.frontend.shapes import runtime_inputs
from tilefuse.ir.dtypes import DType
from tilefuse.ort.provider import CUDA_EP_NAME, EP_NAME
from tilefuse.ort.segment import node_reads
from tilefuse.plan.files import read_verified
from tilefuse.plan.model import BufferKind, IndexSite, Kernel, KernelStep, Plan

CUSTOM_DOMAIN = "ai.tilefuse"
CUSTOM_OP = "FusedKernel"  # a CPU kernel, on the CPU provider
CUSTOM_OP_CUDA = "FusedKernelCuda"  # a CUDA kernel, on the CUDA provider's compute stream
KERNELS_DIR = "kernels"
# onnx stamps its newest IR (14 with onnx 1.23), which released onnxruntimes reject; IR 10
# covers the opsets the zoo uses, as in models/registry.py.
MAX_IR_VERSION = 10


def _onnx_type(dtype: DType | str) -> int:
    return TO_ONNX_DTYPE[DType(dtype) if isinstance(dtype, str) else dtype]


class Stitcher:
    """Turns plans into nodes, initializers and value_info of the new model, and writes
    the kernels they name."""

    def __init__(self, out: Path, mode: str, cuda: bool) -> None:
        self.out = out
        self.mode = mode
        self.cuda = cuda
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.value_info: list[onnx.ValueInfoProto] = []
        self.kernel_files: dict[str, tuple[str, str]] = {}  # kernel name -> (sha256, library file name)
        self.descriptors: dict[tuple[str, tuple[IndexSite, ...]], str] = {}  # (library, sites) -> descriptor path
        self.kernel_nodes = 0

    def add_plan(self, r: int, plan: Plan) -> None:
        names: dict[int, str] = {b.buffer: b.name for b in plan.inputs}
        aliases: list[tuple[int, str]] = []
        for output in plan.outputs:
            kind = plan.buffers[output.buffer].kind
            if output.buffer not in names and kind in (BufferKind.OUTPUT, BufferKind.CONSTANT):
                names[output.buffer] = output.name
            else:
                aliases.append((output.buffer, output.name))
        for buf in plan.buffers:
            names.setdefault(buf.id, f"tilefuse/r{r}/{buf.name}")
            if buf.kind is BufferKind.CONSTANT:
                self.initializers.append(numpy_helper.from_array(np.asarray(plan.weights[buf.name]), names[buf.id]))
        for i, step in enumerate(plan.steps):
            if not isinstance(step, KernelStep):  # _compile_regions moved every host step's node to onnxruntime
                raise TilefuseError(f"export-ort: region {r} still has {step.label}")
            kernel = plan.kernels[step.kernel]
            rel = self._write_kernel(kernel, step.sites, plan.cpu_requires)
            ins = [names[b] for b in step.inputs]
            outs = [names[b] for b in step.outputs]
            node = self._node(f"tilefuse_r{r}_{i}_{kernel.name}", ins, outs, rel)
            _describe(node, kernel, step)
            self.nodes.append(node)
            self.kernel_nodes += 1
            for b in step.outputs:
                t = plan.buffers[b].type
                self.value_info.append(helper.make_tensor_value_info(names[b], _onnx_type(t.dtype), list(t.shape)))
        for b, name in aliases:
            self.nodes.append(helper.make_node("Identity", [names[b]], [name], name=f"tilefuse_r{r}_alias_{name}"))

    def _node(self, name: str, ins: list[str], outs: list[str], rel: str) -> onnx.NodeProto:
        if self.mode == "ep":
            return helper.make_node("EPContext", ins, outs, name=name, domain="com.microsoft",
                                    source=CUDA_EP_NAME if self.cuda else EP_NAME,
                                    embed_mode=0, ep_cache_context=rel, main_context=1)
        op = CUSTOM_OP_CUDA if self.cuda else CUSTOM_OP
        return helper.make_node(op, ins, outs, name=name, domain=CUSTOM_DOMAIN, kernel=rel)

    def _write_kernel(self, kernel: Kernel, sites: tuple[IndexSite, ...], requires: tuple[str, ...] = ()) -> str:
        """Copy the kernel's library (once) and write its descriptor for these check
        sites; the descriptor's path relative to the model."""
        name = self._library(kernel)
        rel = self.descriptors.get((name, sites))
        if rel is not None:
            return rel
        variant = name if not sites else f"{name}-{len([k for k in self.descriptors if k[0] == name and k[1]])}"
        rel = f"{KERNELS_DIR}/{variant}.tfk"
        (self.out / rel).write_text(descriptor(kernel, name, sites, self.cuda, requires))
        self.descriptors[(name, sites)] = rel
        return rel

    def _library(self, kernel: Kernel) -> str:
        """The kernel's file name beside the model, without suffix (copied on first use)."""
        known = self.kernel_files.get(kernel.name)
        if known and known[0] == kernel.sha256:
            return known[1]
        name = kernel.name if not known else f"{kernel.name}_{kernel.sha256[:8]}"  # same name, other content
        folder = self.out / KERNELS_DIR
        folder.mkdir(parents=True, exist_ok=True)
        # What the plan linked, or nothing: the build cache may have changed since.
        (folder / f"{name}{kernel.suffix}").write_bytes(read_verified(kernel.path, kernel.sha256, f"kernel {kernel.name}"))
        self.kernel_files[kernel.name if not known else name] = (kernel.sha256, name)
        return name


def _describe(node: onnx.NodeProto, kernel: Kernel, step: KernelStep) -> None:
    """What the node holds, for people and for Netron (its description and properties):
    the kernel, its pattern, the ONNX nodes it computes and their op types, the estimate.
    onnxruntime reads none of it."""
    facts = step.facts
    pattern = str(kernel.schedule.get("family", "")) if kernel.schedule else ""
    nodes = facts.onnx_nodes if facts is not None else ()
    ops = facts.onnx_ops if facts is not None else ()
    shown = ", ".join(nodes[:8]) + (f" and {len(nodes) - 8} more" if len(nodes) > 8 else "")
    node.doc_string = (f"tilefuse kernel {kernel.name}" + (f" ({pattern})" if pattern else "")
                       + (f": {'+'.join(ops)}" if ops else "") + (f" computing {shown}" if shown else ""))
    props = {"tilefuse.kernel": kernel.name, "tilefuse.pattern": pattern, "tilefuse.onnx_ops": "+".join(ops),
             "tilefuse.source_nodes": ",".join(nodes)}
    if facts is not None and facts.estimated_seconds is not None:
        props["tilefuse.estimated_us"] = f"{facts.estimated_seconds * 1e6:.2f}"
    if hasattr(node, "metadata_props"):  # onnx >= 1.16 (IR 10): Netron lists them as properties
        for key, value in props.items():
            if value:
                entry = node.metadata_props.add()
                entry.key, entry.value = key, value


def tilefuse_nodes(model: onnx.ModelProto) -> dict[str, str]:
    """The nodes of ``model`` that an export made: node name -> how they run ("plugin
    execution provider, cpu", "custom ops"). EPContext nodes of other providers are not."""
    found = {}
    for n in model.graph.node:
        if n.op_type == "EPContext" and n.domain == "com.microsoft":
            source = next((a.s.decode() for a in n.attribute if a.name == "source"), "")
            if source in (EP_NAME, CUDA_EP_NAME):
                found[n.name] = f"plugin execution provider, {'cuda' if source == CUDA_EP_NAME else 'cpu'}"
        elif n.domain == CUSTOM_DOMAIN:
            found[n.name] = f"custom ops, {'cuda' if n.op_type == CUSTOM_OP_CUDA else 'cpu'}"
    return found


def descriptor(kernel: Kernel, library: str, sites: tuple[IndexSite, ...], cuda: bool,
               requires: tuple[str, ...] = ()) -> str:
    """The descriptor of ``kernel`` (format: csrc/tf_kernel.h), its file copied beside it as
    ``library`` plus the kernel's suffix, checking ``sites``; ``requires``: the CPU
    extensions a CPU kernel may use (the plan's ``cpu_requires``), checked where it loads."""
    lines = ["tilefuse-kernel 1", f"target {'cuda' if cuda else 'cpu'}", f"name {library}",
             f"library {library}{kernel.suffix}", f"symbol {kernel.symbol}", f"sha256 {kernel.sha256}"]
    if requires and not cuda:
        lines.append(f"requires {' '.join(requires)}")
    for p in kernel.params:
        lines.append(f"{p.role} {_onnx_type(p.dtype)} {len(p.shape)} {' '.join(map(str, p.shape))}".rstrip())
    lines += [f"check {s.extent} {' '.join(s.what.split())}" for s in sites]
    if cuda:
        lines += _launch_lines(kernel)
    return "\n".join(lines) + "\n"


def _launch_lines(kernel: Kernel) -> list[str]:
    """The launch of a CUDA kernel, as tf_cuda.c reads it: grid, block, dynamic shared
    memory, and each kernel argument (a param's pointer, or a TMA descriptor over it)."""
    launch = kernel.launch
    if not isinstance(launch, CudaLaunch):
        raise TilefuseError(f"kernel {kernel.name}: a {type(launch).__name__} is not a CUDA launch")
    return [f"grid {' '.join(map(str, launch.grid))}", f"block {' '.join(map(str, launch.block))}",
            f"smem {launch.dynamic_smem}", *map(_arg_line, launch.args)]


def _arg_line(arg: KernelArg) -> str:
    t = arg.tma
    if t is None:
        return f"arg pointer {arg.param}"
    numbers = [t.dtype, t.rank, t.interleave, t.swizzle, t.l2_promotion, t.oob_fill,
               *t.dims, *t.strides, *t.box, *t.element_strides]
    return f"arg tensormap {arg.param} {' '.join(map(str, numbers))}"


def assemble(work: onnx.ModelProto, kept: dict[str, str], stitcher: Stitcher, mode: str) -> onnx.ModelProto:
    kept_nodes = [n for n in work.graph.node if n.name in kept]
    nodes = _toposort(kept_nodes + stitcher.nodes, {i.name for i in work.graph.input} |
                      {t.name for t in work.graph.initializer} | {t.name for t in stitcher.initializers})
    read = {name for n in nodes for name in node_reads(n)} | {o.name for o in work.graph.output}
    initializers = [t for t in work.graph.initializer if t.name in read] + stitcher.initializers
    init_names = {t.name for t in initializers}
    inputs = [i for i in runtime_inputs(work)] + [i for i in work.graph.input if i.name in init_names]
    graph = helper.make_graph(nodes, work.graph.name or "model", inputs, list(work.graph.output), initializers,
                              value_info=stitcher.value_info)
    domain = "com.microsoft" if mode == "ep" else CUSTOM_DOMAIN
    opsets = [o for o in work.opset_import if o.domain != domain] + [helper.make_opsetid(domain, 1)]
    proto = helper.make_model(graph, opset_imports=opsets, producer_name="tilefuse export-ort")
    proto.ir_version = min(max(work.ir_version, 7), MAX_IR_VERSION)
    return proto


def _toposort(nodes: list[onnx.NodeProto], available: set[str]) -> list[onnx.NodeProto]:
    """Nodes in an order where each reads only values already produced (stable)."""
    have = set(available)
    pending = list(nodes)
    ordered: list[onnx.NodeProto] = []
    while pending:
        rest = []
        for n in pending:
            if all(x in have for x in n.input if x):
                ordered.append(n)
                have.update(o for o in n.output if o)
            else:
                rest.append(n)
        if len(rest) == len(pending):
            missing = sorted({x for n in rest for x in n.input if x and x not in have})[:5]
            raise TilefuseError(f"export-ort: the stitched model has a cycle or reads unknown values {missing}")
        pending = rest
    return ordered
