"""Parsing shared command-line arguments."""
from __future__ import annotations

import argparse


def parse_shapes(items: list[str] | None) -> dict[str, tuple[int, ...] | int]:
    """``--shape input_ids=1,128`` (a whole input) or ``--shape batch=1`` (a dim symbol)."""
    shapes: dict[str, tuple[int, ...] | int] = {}
    for item in items or []:
        name, sep, dims = item.partition("=")
        if not sep or not name:
            raise argparse.ArgumentTypeError(f"--shape expects NAME=D0,D1,... , got {item!r}")
        try:
            values = tuple(int(d) for d in dims.replace("x", ",").split(",") if d.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"--shape {item!r}: dims must be integers") from None
        if any(v < 0 for v in values):
            raise argparse.ArgumentTypeError(f"--shape {item!r}: dims must be non-negative")
        shapes[name] = values
    return shapes


def add_shape_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--shape",
        action="append",
        metavar="NAME=D0,D1,...",
        help="bind an input's shape (input_ids=1,128) or a dynamic dim by its symbol (batch=1); repeatable",
    )


def parse_consts(items: list[str] | None) -> dict[str, object]:
    """``--const sample_rate=16000`` (a number, true/false) or ``--const ids=1,2,3`` (a
    list, reshaped to the input's shape when bound)."""
    consts: dict[str, object] = {}
    for item in items or []:
        name, sep, text = item.partition("=")
        if not sep or not name or not text.strip():
            raise argparse.ArgumentTypeError(f"--const expects NAME=VALUE or NAME=V0,V1,... , got {item!r}")
        try:
            values = [_number(v.strip()) for v in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"--const {item!r}: values must be numbers or true/false") from None
        consts[name] = values[0] if len(values) == 1 else values
    return consts


def _number(text: str) -> int | float | bool:
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        return float(text)


def add_const_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--const",
        action="append",
        metavar="NAME=VALUE",
        help="bind an input to a value known at compile time (sample_rate=16000; a list as V0,V1,...): "
             "the compiled model no longer takes it, and an If on it keeps only the branch taken; repeatable",
    )


def check_threads(n: int | None) -> int | None:
    """``--threads N``: a non-negative count (0: the default), or None when not given."""
    if n is not None and n < 0:
        raise argparse.ArgumentTypeError(f"--threads expects a non-negative integer, got {n}")
    return n


def add_cpu_isa_arg(p: argparse.ArgumentParser) -> None:
    from tilefuse.cpu_isa import CHOICES

    p.add_argument("--cpu-isa", choices=CHOICES, default=None,
                   help="instruction-set level of the CPU kernels: native (default: this machine's every extension; "
                        "the plan loads only where they all are) or an x86-64 level for plans that run on other "
                        "machines (x86-64-v3: AVX2 and FMA; x86-64-v4: and AVX-512)")


def cli_target(name: str, cpu_isa: str | None):
    """The target ``--target NAME`` names, with ``--cpu-isa`` applied (CPU targets only)."""
    from tilefuse.cpu_isa import check_isa
    from tilefuse.errors import InputError
    from tilefuse.target import adjust, get_target

    target = get_target(name)
    if cpu_isa is None:
        return target
    if target.family != "cpu":
        raise InputError(f"--cpu-isa is for CPU kernels; target {target.name} builds GPU kernels")
    try:
        return adjust(target, codegen__isa=check_isa(cpu_isa))
    except ValueError as e:
        raise InputError(f"--cpu-isa: {e}") from None
