"""`tilefuse cache [--clear]`: where tilefuse's build cache is and what it holds."""
from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="show the build cache ($TILEFUSE_CACHE, default ~/.cache/tilefuse) or clear it")
    p.add_argument("--clear", action="store_true", help="remove the compiled kernels, onnxruntime libraries and cached plans")
    p.add_argument("--models", action="store_true", help="with --clear: the zoo's built models too")
    p.set_defaults(func=run)


def _size(nbytes: int) -> str:
    n = float(nbytes)
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def run(args: argparse.Namespace) -> int:
    from tilefuse import cache
    from tilefuse.errors import TilefuseError

    if args.models and not args.clear:
        raise TilefuseError("--models goes with --clear")
    if args.clear:
        for part in cache.clear(models=args.models):
            print(f"removed {part.name}: {part.files} files, {_size(part.bytes)} ({part.path})")
        return 0
    print(f"cache: {cache.root()}")
    total = 0
    for part in cache.parts():
        total += part.bytes
        print(f"  {part.name:22s} {part.files:7d} files {_size(part.bytes):>10s}  {part.path}")
    print(f"  {'total':22s} {'':7s}       {_size(total):>10s}")
    return 0
