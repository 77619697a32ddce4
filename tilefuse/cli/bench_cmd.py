"""`tilefuse bench PLAN_OR_MODEL`: latency of a plan, optionally against onnxruntime."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from tilefuse.bench import measure, measure_interleaved
from tilefuse.cli.args import add_shape_arg, check_threads, parse_shapes
from tilefuse.cli.run_cmd import _load_inputs, plan_ranges, random_feeds
from tilefuse.errors import InputError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="time a plan (compiling a model first), optionally against onnxruntime")
    add_plan_args(p)
    p.add_argument("--against", choices=["onnxruntime"], help="also time onnxruntime on the source model (the two in turn, in blocks of about 0.2 s)")
    p.add_argument("--model", metavar="MODEL.onnx", help="source model for --against (default: the plan's)")
    p.add_argument("--warmup", type=int, default=3, metavar="N", help="untimed runs first (default 3)")
    p.add_argument("--iterations", "--repeats", dest="iterations", type=int, default=20, metavar="N",
                   help="timed runs, at least (default 20)")
    p.add_argument("--duration", type=float, metavar="SECONDS",
                   help="and for at least this long (default 0.5, with at most 10 x --iterations runs)")
    p.add_argument("--max-iterations", type=int, metavar="N", help="stop after this many timed runs "
                   "(default: no limit when --duration is given, else 10 x --iterations)")
    p.add_argument("--threads", type=int, help="threads for both runtimes (default: tilefuse's, OMP_NUM_THREADS "
                   "else one per core, for both)")
    p.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    p.add_argument("--profile", action="store_true", help="then time each kernel on its own: the table of "
                   "`tilefuse profile` (same --warmup and --iterations; in --json as \"profile\")")
    p.set_defaults(func=run)


def open_session(args: argparse.Namespace):
    """The plan (a model compiled first), its session with ``--threads`` and the inputs
    (``--input`` files, the others random); and the source model's path ("" unknown)."""
    from tilefuse.plan import load_plan
    from tilefuse.runtime import InferenceSession
    from tilefuse.runtime.session import takes_threads

    check_threads(args.threads)
    if Path(args.target).is_dir():
        plan = load_plan(args.target)
    else:
        from tilefuse.compiler import compile

        plan = compile(args.target, args.device, parse_shapes(args.shape))
    # a GPU plan's kernels take no thread count; then --threads is onnxruntime's alone
    session = InferenceSession(plan, threads=args.threads if takes_threads(plan.target) else None)
    source = getattr(args, "model", None) or plan.source_path or (args.target if not Path(args.target).is_dir() else "")
    feeds = random_feeds(plan.input_types(), _load_inputs(args.input), 0, plan_ranges(source, plan.input_types()))
    return plan, session, feeds, source


def add_plan_args(p: argparse.ArgumentParser) -> None:
    """What ``open_session`` reads: the plan or model, its shapes and target, inputs, threads."""
    p.add_argument("target", metavar="PLAN_OR_MODEL", help="a .tfplan directory or an .onnx file")
    add_shape_arg(p)
    p.add_argument("--target", dest="device", default="cpu", help="compile target when given a model (default cpu)")
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                   help="an input from a .npy file (repeatable; the others are random)")


def run(args: argparse.Namespace) -> int:
    from tilefuse.runtime.session import takes_threads

    if args.warmup < 0 or args.iterations < 1 or (args.duration or 0) < 0 or (args.max_iterations or 1) < 1:
        raise InputError("--warmup must be >= 0, --iterations and --max-iterations >= 1, --duration >= 0")
    plan, session, feeds, source = open_session(args)
    on_host = takes_threads(plan.target)
    seconds = 0.5 if args.duration is None else args.duration
    cap = args.max_iterations or (10 * args.iterations if args.duration is None else 1 << 62)

    # what ran: the count the session's kernels run with (None: they run on a GPU)
    result = {"plan_target": plan.target, "threads": session.threads}
    print(f"tilefuse threads: {session.threads if on_host else 'none (GPU kernels)'}")
    run_tilefuse = lambda: session.run(None, feeds)  # noqa: E731
    if not args.against:
        t = measure(run_tilefuse, warmup=args.warmup, repeats=args.iterations, min_seconds=seconds, max_repeats=cap)
    else:
        import onnxruntime as ort

        model = source
        if not model or not Path(model).is_file():
            raise InputError("--against needs the source model: pass --model")
        so = ort.SessionOptions()
        # the count asked for, else the one tilefuse resolved (0: onnxruntime's default); tilefuse
        # may run with fewer (1 when no kernel has a parallel loop), and records that
        so.intra_op_num_threads = args.threads or session.threads or 0
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        ref = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
        result["onnxruntime_threads"] = ref.get_session_options().intra_op_num_threads
        print(f"onnxruntime threads: {result['onnxruntime_threads'] or 'its default'}")
        # in turn, in blocks of about 0.2 s: a machine whose speed drifts moves both alike
        t, r = measure_interleaved([run_tilefuse, lambda: ref.run(None, feeds)], warmup=args.warmup,
                                   repeats=args.iterations, min_seconds=seconds, max_repeats=cap)
    result["tilefuse_ms"] = t.median_ms
    result["tilefuse"] = t.as_dict()
    print(f"tilefuse     {t.report()}")
    if args.against:
        result["onnxruntime_ms"] = r.median_ms
        result["onnxruntime"] = r.as_dict()
        result["ratio"] = t.median_ms / r.median_ms
        print(f"onnxruntime  {r.report()}")
        print(f"tilefuse / onnxruntime = {result['ratio']:.2f} (timed in turn, blocks of about 0.2 s each)")
    if args.profile:
        from tilefuse.profile import profile

        prof = profile(session, feeds, warmup=args.warmup, iterations=args.iterations)
        print(prof.table())
        result["profile"] = prof.as_dict()
    if args.json:
        write_json(args.json, result)
    return 0


def write_json(path: str, data: object) -> None:
    """``--json FILE``; a file that cannot be written is an InputError, not a traceback."""
    try:
        Path(path).write_text(json.dumps(data, indent=1))
    except OSError as e:
        raise InputError(f"--json {path}: {e.strerror or e}") from None
