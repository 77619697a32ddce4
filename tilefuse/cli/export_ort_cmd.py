"""`tilefuse export-ort MODEL -o DIR`: the model with tilefuse kernels, for onnxruntime."""
from __future__ import annotations

import argparse

from tilefuse.cli.args import add_const_arg, add_cpu_isa_arg, add_shape_arg, cli_target, parse_consts, parse_shapes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export-ort", help="write DIR/model.onnx whose fused groups run as tilefuse kernels inside onnxruntime")
    p.add_argument("model", help="an .onnx file")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="folder for model.onnx, its kernels and weights")
    p.add_argument("--target", default="cpu", help="cpu (default) or cuda:sm_90a")
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16", "tf32"],
                   help="arithmetic of the kernels, as for optimize (inputs and outputs keep their dtypes)")
    add_shape_arg(p)
    add_const_arg(p)
    add_cpu_isa_arg(p)
    p.add_argument("--as", dest="mode", choices=("ep", "custom-ops"), default="ep",
                   help="ep: EPContext nodes for the tilefuse execution provider, TilefuseExecutionProvider or, "
                        "for cuda, TilefuseCudaExecutionProvider (onnxruntime >= 1.23, default); "
                        "custom-ops: ai.tilefuse nodes and a custom-op library beside the model")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tilefuse.ort import export_ort

    result = export_ort(args.model, args.output, cli_target(args.target, args.cpu_isa), parse_shapes(args.shape), args.mode,
                        consts=parse_consts(args.const), precision=args.precision)
    print(result.summary())
    return 0
