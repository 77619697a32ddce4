"""`tilefuse optimize MODEL`: import, partition, (later) compile into a plan."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from tilefuse.cli.args import add_shape_arg, parse_shapes
from tilefuse.errors import TilefuseError
from tilefuse.frontend import import_onnx
from tilefuse.frontend.loader import load_model
from tilefuse.partition import partition_graph
from tilefuse.partition.summary import format_explain, format_summary, summarize_partition
from tilefuse.target import get_target


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("optimize", help="partition a model into fused kernels (and, later, compile a plan)")
    p.add_argument("model", help="an .onnx file")
    add_shape_arg(p)
    p.add_argument("--target", default="cpu", help="cpu (default) or cuda:sm_90a")
    p.add_argument("--dry-run", action="store_true", help="stop after partitioning")
    p.add_argument("--summary-json", metavar="FILE", help="write the partition summary as JSON")
    p.add_argument("--report", metavar="FILE.html", help="write a self-contained HTML report")
    p.add_argument("--explain", action="store_true", help="print why neighbouring kernels stayed apart")
    p.add_argument("-o", "--output", metavar="OUT.tfplan", help="where to write the plan")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    target = get_target(args.target)
    proto = load_model(args.model)
    onnx_nodes = len(proto.graph.node)
    graph = import_onnx(proto, parse_shapes(args.shape))
    partition = partition_graph(graph, target)
    summary = summarize_partition(partition, onnx_nodes)
    print(format_summary(summary))
    if args.explain:
        print(format_explain(partition))
    if args.summary_json:
        Path(args.summary_json).write_text(json.dumps(summary, indent=1))
    if args.report:
        from tilefuse.report import render_html

        Path(args.report).write_text(render_html(partition, summary))
        print(f"report: {args.report}")
    if not args.dry_run:
        raise TilefuseError("code generation and plans are not built yet (issue 4); use --dry-run")
    return 0
