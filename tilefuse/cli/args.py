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


def check_threads(n: int | None) -> int | None:
    """``--threads N``: a non-negative count (0: the default), or None when not given."""
    if n is not None and n < 0:
        raise argparse.ArgumentTypeError(f"--threads expects a non-negative integer, got {n}")
    return n
