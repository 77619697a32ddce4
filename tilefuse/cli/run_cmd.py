"""`tilefuse run PLAN_OR_MODEL`: run a compiled plan (or a model, on the reference
executor) and optionally check it against onnxruntime on the same inputs."""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from tilefuse.cli.args import add_shape_arg, check_threads, parse_shapes
from tilefuse.compare import compare_output
from tilefuse.errors import InputError
from tilefuse.ir.types import TensorType


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a plan (or a model on the reference executor); --check against onnxruntime")
    p.add_argument("target", metavar="PLAN_OR_MODEL", help="a .tfplan directory or an .onnx file")
    add_shape_arg(p)
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy", help="an input from a .npy file; repeatable")
    p.add_argument("--random", action="store_true", help="fill inputs not given with random values")
    p.add_argument("--seed", type=int, default=None, help="seed for --random (default: fresh)")
    p.add_argument("--check", action="store_true", help="compare with onnxruntime; exit 1 beyond tolerance")
    p.add_argument("--model", metavar="MODEL.onnx", help="the source model for --check (default: the one the plan records)")
    p.add_argument("--save", metavar="DIR", help="write each output to DIR/NAME.npy")
    p.add_argument("--threads", type=int, help="threads for a CPU plan's kernels and for --check's onnxruntime "
                   "(default: OMP_NUM_THREADS, else one per core)")
    p.set_defaults(func=run)


def random_feeds(inputs: list[tuple[str, TensorType]], given: dict[str, np.ndarray], seed: int | None) -> dict[str, np.ndarray]:
    """Normal floats; ints in [0, 2) so that ids, masks and indices are all valid; random bools."""
    rng = np.random.default_rng(seed)
    feeds = dict(given)
    for name, t in inputs:
        if name in feeds:
            continue
        if t.dtype.is_float:
            feeds[name] = rng.standard_normal(t.shape).astype(t.dtype.numpy)
        elif t.dtype.is_int:
            feeds[name] = rng.integers(0, 2, t.shape).astype(t.dtype.numpy)
        else:
            feeds[name] = rng.integers(0, 2, t.shape).astype(bool)
    return feeds


def _load_inputs(items: list[str] | None) -> dict[str, np.ndarray]:
    out = {}
    for item in items or []:
        name, sep, path = item.partition("=")
        if not sep:
            raise InputError(f"--input expects NAME=FILE.npy, got {item!r}")
        try:
            out[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise InputError(f"--input {name}: cannot read {path}: {e}") from None
    return out


def run(args: argparse.Namespace) -> int:
    given = _load_inputs(args.input)
    threads = check_threads(args.threads)
    if Path(args.target).is_dir():
        from tilefuse.plan import load_plan
        from tilefuse.runtime import InferenceSession
        from tilefuse.runtime.session import takes_threads

        plan = load_plan(args.target)
        session = InferenceSession(plan, threads=threads if takes_threads(plan.target) else None)
        threads = threads or session.threads
        inputs = session.plan.input_types()
        feeds = random_feeds(inputs, given, args.seed) if args.random else given
        names = [o.name for o in session.get_outputs()]
        outputs = dict(zip(names, session.run(None, feeds)))
        model = args.model or session.plan.source_path
    else:
        from tilefuse.frontend import import_onnx
        from tilefuse.reference import run_graph

        shapes = parse_shapes(args.shape)
        for name, a in given.items():
            shapes.setdefault(name, a.shape)
        graph = import_onnx(args.target, shapes)
        inputs = [(v.name, v.type) for v in graph.inputs]
        feeds = random_feeds(inputs, given, args.seed) if args.random else given
        outputs = run_graph(graph, feeds)
        model = args.target
    for name, y in outputs.items():
        stats = f"mean {float(np.mean(y)):.4g}, std {float(np.std(y)):.4g}" if y.size and y.dtype.kind in "fiu" else ""
        print(f"{name}: {y.dtype}{list(y.shape)} {stats}")
        if args.save:
            Path(args.save).mkdir(parents=True, exist_ok=True)
            np.save(Path(args.save) / f"{name.replace('/', '_')}.npy", y)
    if not args.check:
        return 0
    if not model or not Path(model).is_file():
        raise InputError(f"--check needs the source model; {model or 'the plan records none'} is not a file: pass --model")
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads or 0  # 0: onnxruntime's default
    session = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    expected = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    worst = 0
    for name, y in outputs.items():
        c = compare_output(name, y, expected[name])
        verdict = "ok" if c.ok else f"FAIL: {c.problem}"
        print(f"check {name}: max abs error {c.max_abs_error:.3g} (scale {c.scale:.3g}, tolerance {c.tolerance:g} x scale) {verdict}")
        worst = worst or (0 if c.ok else 1)
    return worst
