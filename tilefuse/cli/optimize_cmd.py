"""`tilefuse optimize MODEL`: import, partition and compile into a plan."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Mapping

from tilefuse.cli.args import add_const_arg, add_cpu_isa_arg, add_shape_arg, cli_target, parse_consts, parse_shapes
from tilefuse.errors import InputError

from tilefuse.frontend import import_onnx
from tilefuse.frontend.loader import load_model
from tilefuse.frontend.precision import with_precision
from tilefuse.partition import partition_graph
from tilefuse.frontend.scope import op_types
from tilefuse.partition.summary import format_explain, format_summary, summarize_partition


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("optimize", help="partition a model into fused kernels and compile them into a plan")
    p.add_argument("model", help="an .onnx file")
    add_shape_arg(p)
    add_const_arg(p)
    p.add_argument("--target", default="cpu", help="cpu (default) or cuda:sm_90a")
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16", "tf32"],
                   help="arithmetic of float32 models: fp16/bf16 convert weights and activations "
                        "(inputs and outputs keep their dtypes; accumulation stays float32); tf32 lets "
                        "float32 matrix products round operands to TF32 on GPU tensor cores")
    p.add_argument("--dry-run", action="store_true", help="stop after partitioning")
    p.add_argument("--summary-json", metavar="FILE", help="write the partition summary as JSON")
    p.add_argument("--report", metavar="FILE.html", help="write a self-contained HTML report")
    p.add_argument("--profile", metavar="FILE.json", help="with --report: measured times from `tilefuse profile "
                   "PLAN --json FILE.json` (a plan of this model and target) beside the estimates")
    p.add_argument("--explain", action="store_true", help="print why neighbouring kernels stayed apart")
    add_cpu_isa_arg(p)
    p.add_argument("-o", "--output", metavar="OUT.tfplan", help="where to write the plan")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    target = cli_target(args.target, args.cpu_isa)
    shapes = parse_shapes(args.shape)
    consts = parse_consts(args.const)
    if args.profile and not args.report:
        raise InputError("--profile goes with --report: it puts measured times into the report")
    if args.dry_run:
        proto = load_model(args.model)
        onnx_nodes = len(proto.graph.node)
        graph = with_precision(import_onnx(proto, shapes, constants=consts), args.precision)
        partition = partition_graph(graph, target)
        compiled = None
        onnx_ops: Mapping[str, str] = op_types(proto.graph)
    else:
        from tilefuse.compiler import compile_model

        from tilefuse.progress import for_terminal

        compiled = compile_model(args.model, target, shapes, precision=args.precision, consts=consts,
                                 progress=for_terminal())
        partition, onnx_nodes, onnx_ops = compiled.partition, compiled.onnx_nodes, compiled.onnx_ops
    summary = summarize_partition(partition, onnx_nodes, onnx_ops)
    print(format_summary(summary))
    if args.explain:
        print(format_explain(partition))
    if args.summary_json:
        Path(args.summary_json).write_text(json.dumps(summary, indent=1))
    if args.report:
        from tilefuse.report import render_html

        measured = _profile(args, target.name, partition) if args.profile else None
        Path(args.report).write_text(render_html(partition, summary, profile=measured))
        print(f"report: {args.report}")
    if compiled is not None:
        out = Path(args.output) if args.output else Path(Path(args.model).stem + ".tfplan")
        compiled.plan.save(out)
        kernels = sum(1 for s in compiled.plan.steps if getattr(s, "kernel", None))
        print(f"plan: {out} ({kernels} kernel steps, {compiled.plan.memory_report()})")
    return 0


def _profile(args: argparse.Namespace, target: str, partition) -> dict:
    """``--profile FILE``, read and checked against the model (its hash), the target and
    the input shapes: the report matches its steps to kernels by group number."""
    from tilefuse.compiler import _sha256
    from tilefuse.profile import load_profile

    data = load_profile(args.profile)
    where = f"--profile {args.profile}"
    if data.get("target") != target:
        raise InputError(f"{where}: a profile on {data.get('target')!r}, this report is for {target!r}")
    if data.get("source_sha256") not in ("", None, _sha256(args.model, None)):
        raise InputError(f"{where}: a profile of another model (its source sha256 differs)")
    shapes = {v.name: list(v.type.shape) for v in partition.graph.inputs}
    if data.get("inputs", shapes) != shapes:
        raise InputError(f"{where}: a profile with inputs {data.get('inputs')}, this model is bound to {shapes} "
                         "(pass the same --shape)")
    return data
