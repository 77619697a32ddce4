"""``python -m models list`` and ``python -m models build`` (see ``--help``)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .registry import ZOO, build, default_cache_dir
from .spec import DTYPES


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m models", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the models, their family, configs and description")
    b = sub.add_parser("build", help="build models into the cache and report sizes and times")
    b.add_argument("--config", choices=("tiny", "real", "all"), default="tiny")
    b.add_argument("--dtype", choices=(*DTYPES, "all"), default="float32")
    b.add_argument("--only", nargs="+", metavar="NAME", choices=sorted(ZOO),
                   help="build only these models")
    b.add_argument("--out", type=Path, default=None,
                   help=f"cache folder (default: {default_cache_dir()})")
    b.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = parser.parse_args(argv)

    if args.command == "list":
        for spec in ZOO.values():
            flag = "" if spec.runs_in_ort else "  [not runnable in onnxruntime]"
            print(f"{spec.name:22} {spec.family:12} {','.join(spec.configs):10} "
                  f"{spec.description}{flag}")
        return 0

    configs = ("tiny", "real") if args.config == "all" else (args.config,)
    dtypes = DTYPES if args.dtype == "all" else (args.dtype,)
    names = args.only or list(ZOO)
    failures = 0
    for name in names:
        for config in configs:
            if config not in ZOO[name].configs:
                continue
            for dtype in dtypes:
                if dtype not in ZOO[name].dtypes and args.dtype == "all":
                    continue
                start = time.perf_counter()
                try:
                    path = build(name, config, dtype, cache_dir=args.out, force=args.force)
                except Exception as exc:  # report every failure, then exit non-zero
                    failures += 1
                    print(f"FAILED {name}-{config}-{dtype}: {type(exc).__name__}: {exc}",
                          flush=True)
                    continue
                seconds = time.perf_counter() - start
                print(f"{path}  {human_size(path.stat().st_size):>10}  {seconds:7.1f} s",
                      flush=True)
    return 1 if failures else 0


def human_size(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


if __name__ == "__main__":
    sys.exit(main())
