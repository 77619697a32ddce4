"""`tilefuse run PLAN_OR_MODEL`: run a compiled plan (or a model, on the reference
executor) and optionally check it against onnxruntime on the same inputs."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

import numpy as np

from tilefuse.cli.args import add_shape_arg, check_threads, parse_consts, parse_shapes
from tilefuse.compare import compare_output
from tilefuse.errors import InputError, ModelLoadError
from tilefuse.frontend.input_ranges import DEFAULT_INT_RANGE, MASK_RANGE, META_RANGES, integer_ranges
from tilefuse.frontend.loader import read_structure
from tilefuse.frontend.qdq import checked_precision
from tilefuse.ir.types import TensorType
from tilefuse.target import CPU, memory_limit

if TYPE_CHECKING:  # imported where --check runs: onnxruntime takes a while to load
    import onnxruntime

# Integers of a plan whose source model is not at hand: nothing says what they index, and
# {0, 1} is valid for any index of a non-trivial dim.
NO_MODEL_RANGE = (0, 2)

RANDOM_HELP = (
    "fill inputs not given with random values: floats normal(0, 1); integers uniform in the range the "
    f"model gives them: its '{META_RANGES}' metadata, else [0, rows) for the indices of a Gather "
    "(GatherElements, GatherND, Scatter*) of data with that many rows, else "
    f"[{MASK_RANGE[0]}, {MASK_RANGE[1]}) for inputs named like a mask, else "
    f"[{DEFAULT_INT_RANGE[0]}, {DEFAULT_INT_RANGE[1]}) (for a plan whose source model is not at hand: "
    f"[{NO_MODEL_RANGE[0]}, {NO_MODEL_RANGE[1]}), valid for any index); bools fair coin flips"
)
CHECK_HELP = (
    "compare with onnxruntime; exit 1 beyond tolerance. By default every output's max abs error must be "
    "within tol x max(1, max |reference|), tol from the output's dtype and the precision the plan "
    "computed in (float32 1e-4, tf32 1e-3, fp16 1e-2, bf16 5e-2; integers exact); a quantized "
    "model (QuantizeLinear/DequantizeLinear) 3e-2, its 8-bit values one step"
)


def _non_negative(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not x >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a non-negative number")
    return x


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a plan (or a model on the reference executor); --check against onnxruntime")
    p.add_argument("target", metavar="PLAN_OR_MODEL", help="a .tfplan directory or an .onnx file")
    add_shape_arg(p)
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy", help="an input from a .npy file; repeatable")
    p.add_argument("--random", action="store_true", help=RANDOM_HELP)
    p.add_argument("--seed", type=int, default=None, help="seed for --random (default: fresh)")
    p.add_argument("--const", action="append", metavar="NAME=VALUE",
                   help="an input bound at compile time (optimize --const): a model binds it as there; for "
                        "--check of a plan, onnxruntime is fed it; repeatable")
    p.add_argument("--check", action="store_true", help=CHECK_HELP)
    p.add_argument("--rtol", type=_non_negative, help="with --check: hold every element to |out - ref| <= atol + rtol x |ref| instead")
    p.add_argument("--atol", type=_non_negative, help="with --check: the absolute part of that bound (default 0 when --rtol is given)")
    p.add_argument("--model", metavar="MODEL.onnx", help="the source model for --check (default: the one the plan records)")
    p.add_argument("--save", metavar="DIR", help="write each output to DIR/NAME.npy")
    p.add_argument("--threads", type=int, help="threads for a CPU plan's kernels and for --check's onnxruntime "
                   "(default: OMP_NUM_THREADS, else one per core)")
    p.set_defaults(func=run)


def random_feeds(inputs: list[tuple[str, TensorType]], given: dict[str, np.ndarray], seed: int | None,
                 ranges: Mapping[str, tuple[int, int]] | None = None) -> dict[str, np.ndarray]:
    """Normal floats; integers uniform in ``ranges[name]`` (half-open), else in
    DEFAULT_INT_RANGE; random bools. Inputs in ``given`` are kept as they are."""
    rng = np.random.default_rng(seed)
    feeds = dict(given)
    limit, whose = memory_limit(CPU)
    for name, t in inputs:
        if name in feeds:
            continue
        if t.nbytes > limit:  # refused before numpy tries (and the kernel may not refuse)
            raise InputError(f"--random: input {name!r} {t} takes {t.nbytes / 2**30:.1f} GiB, "
                             f"more than the {limit / 2**30:.1f} GiB of {whose}")
        if t.dtype.is_float:
            feeds[name] = rng.standard_normal(t.shape).astype(t.dtype.numpy)
        elif t.dtype.is_int:
            low, high = (ranges or {}).get(name, DEFAULT_INT_RANGE)
            info = np.iinfo(t.dtype.numpy)
            feeds[name] = rng.integers(max(low, info.min), min(high, int(info.max) + 1), t.shape).astype(t.dtype.numpy)
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


def plan_ranges(model: str, inputs: list[tuple[str, TensorType]]) -> dict[str, tuple[int, int]]:
    """The ranges of a plan's integer inputs, from its source ``model`` when it is at hand,
    else NO_MODEL_RANGE."""
    try:
        proto = read_structure(model) if model else None
    except ModelLoadError:  # --random needs no model; --check reports a broken one
        proto = None
    if proto is None:
        return {name: NO_MODEL_RANGE for name, t in inputs if t.dtype.is_int}
    return integer_ranges(proto, dict(inputs))


def run(args: argparse.Namespace) -> int:
    if (args.rtol is not None or args.atol is not None) and not args.check:
        raise InputError("--rtol and --atol set the tolerance of --check; pass --check too")
    given = _load_inputs(args.input)
    consts = parse_consts(args.const)
    threads = check_threads(args.threads)
    if Path(args.target).is_dir():
        from tilefuse.plan import load_plan
        from tilefuse.runtime import InferenceSession
        from tilefuse.runtime.session import takes_threads

        plan = load_plan(args.target)
        session = InferenceSession(plan, threads=threads if takes_threads(plan.target) else None)
        threads = threads or session.threads
        inputs = session.plan.input_types()
        model = args.model or session.plan.source_path
        precision = session.plan.precision
        ranges = plan_ranges(model, inputs) if args.random else {}
        feeds = random_feeds(inputs, given, args.seed, ranges) if args.random else given
        names = [o.name for o in session.get_outputs()]
        outputs = dict(zip(names, session.run(None, feeds)))
    else:
        from tilefuse.frontend import import_onnx, load_model
        from tilefuse.reference import run_graph

        shapes = parse_shapes(args.shape)
        for name, a in given.items():
            shapes.setdefault(name, a.shape)
        proto = load_model(args.target)
        graph = import_onnx(proto, shapes, constants=consts)
        inputs = [(v.name, v.type) for v in graph.inputs]
        ranges = integer_ranges(proto, dict(inputs)) if args.random else {}
        feeds = random_feeds(inputs, given, args.seed, ranges) if args.random else given
        outputs = run_graph(graph, feeds)
        model, precision = args.target, "fp32"
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
    expected = onnxruntime_outputs(str(model), feeds, consts, threads)
    precision = checked_precision(model, precision)  # a QDQ model's values move by 8-bit steps
    worst = 0
    for name, y in outputs.items():
        if name not in expected:
            raise InputError(f"--check: {model} has no output {name!r} (its outputs: {sorted(expected)})")
        c = compare_output(name, y, expected[name], precision=precision, rtol=args.rtol, atol=args.atol)
        print(f"check {name}: {c.describe()}")
        worst = worst or (0 if c.ok else 1)
    return worst


def onnxruntime_outputs(model: str, feeds: Mapping[str, np.ndarray], consts: dict[str, object],
                        threads: int | None = None) -> dict[str, np.ndarray]:
    """onnxruntime's outputs for ``feeds`` (and the --const values a plan was compiled with)
    on its CPU provider; its refusal (of the model or of the inputs) as a one-line error."""
    import onnxruntime as ort

    # onnxruntime raises its own exception classes (Fail, InvalidArgument, NotImplemented,
    # InvalidGraph, ...), all bare Exception subclasses with no common base of their own.
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads or 0  # 0: onnxruntime's default
    try:
        session = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise ModelLoadError(f"--check: onnxruntime cannot load {model}: {_one_line(e)}") from None
    reference_feeds = {**feeds, **_const_feeds(session, consts)}
    missing = [i.name for i in session.get_inputs() if i.name not in reference_feeds]
    if missing:
        raise InputError(f"--check: the source model also takes {missing}, which the plan does not (bound with "
                         f"--const when it was compiled?): give their values with --const NAME=VALUE")
    try:
        values = session.run(None, reference_feeds)
    except Exception as e:
        raise InputError(f"--check: onnxruntime refuses the inputs: {_one_line(e)}") from None
    return dict(zip([o.name for o in session.get_outputs()], values))


def _one_line(e: Exception) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 500 else text[:497] + "..."


def _const_feeds(session: onnxruntime.InferenceSession, consts: dict[str, object]) -> dict[str, np.ndarray]:
    """The --const values as onnxruntime feeds, in each input's declared element type and,
    where its shape is static, that shape."""
    out = {}
    inputs = {i.name: i for i in session.get_inputs()}
    for name, value in consts.items():
        if name not in inputs:
            raise InputError(f"--const names {name!r}, which is no input of the source model; "
                             f"its inputs are {sorted(inputs)}")
        arg = inputs[name]
        dtype = _ORT_TYPES.get(arg.type)
        if dtype is None:
            raise InputError(f"--const {name}: inputs of type {arg.type} cannot be given on the command line")
        try:
            array = np.asarray(value).astype(dtype)
        except (TypeError, ValueError) as e:
            raise InputError(f"--const {name}: {value!r} cannot be read as {arg.type}: {e}") from None
        if array.dtype.kind in "biu" and not np.array_equal(array, np.asarray(value)):
            raise InputError(f"--const {name}: {value!r} is not exactly representable as {arg.type}")
        if all(isinstance(d, int) for d in arg.shape) and array.size == int(np.prod(arg.shape)):
            array = array.reshape(arg.shape)
        out[name] = array
    return out


_ORT_TYPES: dict[str, type[np.generic]] = {f"tensor({k})": v for k, v in {
    "float": np.float32, "double": np.float64, "float16": np.float16, "int8": np.int8, "int16": np.int16,
    "int32": np.int32, "int64": np.int64, "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32,
    "uint64": np.uint64, "bool": np.bool_}.items()}
