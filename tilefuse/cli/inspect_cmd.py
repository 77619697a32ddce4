"""`tilefuse inspect MODEL`: what the model holds and what tilefuse makes of it;
`tilefuse inspect PLAN.tfplan`: a compiled plan's kernels and the schedule of each."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from tilefuse.cli.args import add_shape_arg, parse_shapes
from tilefuse.errors import UnsupportedOpError
from tilefuse.frontend.summary import ModelSummary, summarize


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="inputs, opsets, op histogram, FLOPs, unsupported ops")
    p.add_argument("model", help="an .onnx file, or a .tfplan directory (its kernels and their schedules)")
    add_shape_arg(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _human(n: float, unit: str = "") -> str:
    for suffix in ("", "K", "M", "G", "T", "P"):
        if abs(n) < 1000:
            return f"{n:.3g}{suffix}{unit}"
        n /= 1000
    return f"{n:.3g}E{unit}"


def format_summary(s: ModelSummary) -> str:
    lines = [f"model {s.name!r}  (IR {s.ir_version}, opsets {s.opsets}, {s.producer or 'unknown producer'})"]
    for title, values in (("inputs", s.inputs), ("outputs", s.outputs)):
        lines.append(f"{title}:")
        lines += [f"  {v['name']}: {v['dtype']}{v['shape']}" for v in values]
    lines.append(f"parameters: {s.parameters:,} ({_human(s.parameter_bytes, 'B')})")
    lines.append(f"ONNX nodes: {s.onnx_nodes}")
    lines.append("op histogram: " + ", ".join(f"{k} {v}" for k, v in s.op_histogram.items()))
    if s.tilefuse_export:
        lines.append("a tilefuse export: " + ", ".join(f"{n} kernel node(s) ({how})" for how, n in s.tilefuse_export.items()))
    if s.flops is not None and s.primitives is not None and s.primitive_kinds is not None:  # set together
        lines.append(f"FLOPs: {_human(s.flops)} ({s.flops:,})")
        lines.append(f"primitives: {sum(s.primitives.values())} ({', '.join(f'{k} {v}' for k, v in s.primitive_kinds.items())})")
        lines.append("  " + ", ".join(f"{k} {v}" for k, v in s.primitives.items()))
    elif s.not_imported:
        lines.append(f"FLOPs and primitives: not computed ({s.not_imported})")
    if s.unsupported:
        lines.append(f"unsupported ops ({len(s.unsupported)}):")
        lines += [f"  {u}" for u in s.unsupported]
    else:
        lines.append("unsupported ops: none")
    return "\n".join(lines)


def format_plan(plan) -> str:
    """A plan's header line, then one line per kernel: its name and its schedule record
    (``family: field=value ...``; "no schedule recorded" for older plans)."""
    lines = [str(plan)]
    for k in plan.kernels.values():
        fields = dict(k.schedule)
        family = fields.pop("family", None)
        what = f"{family}: " + " ".join(f"{n}={_value(v)}" for n, v in fields.items()) if family else "no schedule recorded"
        lines.append(f"  {k.name}  {what}")
    return "\n".join(lines)


def _value(v: object) -> str:
    if isinstance(v, list):
        joined = "x".join(map(_value, v)) if all(not isinstance(x, list) for x in v) else ",".join(map(_value, v))
        return joined or "()"
    return repr(v) if isinstance(v, str) and " " in v else str(v)


def _run_plan(args: argparse.Namespace) -> int:
    from tilefuse.plan import load_plan

    plan = load_plan(args.model)
    if args.json:
        kernels = [{"name": k.name, "schedule": k.schedule} for k in plan.kernels.values()]
        print(json.dumps({"target": plan.target, "precision": plan.precision, "kernels": kernels}, indent=1))
    else:
        print(format_plan(plan))
    return 0


def run(args: argparse.Namespace) -> int:
    if Path(args.model).is_dir():  # a .tfplan directory: what was compiled, not the model
        return _run_plan(args)
    summary = summarize(args.model, parse_shapes(args.shape))
    _recognise_export(args.model, summary)
    if args.json:
        print(json.dumps(summary.to_json(), indent=1, default=str))
    else:
        print(format_summary(summary))
    if summary.unsupported:
        raise UnsupportedOpError(summary.unsupported)
    if summary.error is not None:  # printed in the summary too; the exit status must say it
        raise summary.error
    return 0


def _recognise_export(model: str, summary: ModelSummary) -> None:
    """An export-ort model's tilefuse nodes are its kernels, not unsupported ops."""
    from collections import Counter

    import onnx

    from tilefuse.ort.stitch import tilefuse_nodes

    try:
        proto = onnx.load(model, load_external_data=False)
    except Exception:  # summarize has already reported what is wrong with the file
        return
    exported = tilefuse_nodes(proto)
    if not exported:
        return
    summary.tilefuse_export = dict(Counter(exported.values()))
    summary.unsupported = [u for u in summary.unsupported if not set(u.nodes) <= set(exported)]
    if not summary.unsupported and summary.flops is None:
        summary.not_imported = "its kernels were compiled by tilefuse; inspect the model it was exported from"
