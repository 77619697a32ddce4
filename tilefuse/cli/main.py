"""`tilefuse` entry point: subcommands, and one clear line for every error."""
from __future__ import annotations

import argparse
import sys
import traceback

from tilefuse.errors import TilefuseError


def build_parser() -> argparse.ArgumentParser:
    import tilefuse
    from tilefuse.cli import (bench_cmd, cache_cmd, conformance_cmd, export_ort_cmd, inspect_cmd, ops_cmd, optimize_cmd,
                              profile_cmd, run_cmd)

    parser = argparse.ArgumentParser(prog="tilefuse", description="Whole-model fusion compiler for ONNX.")
    parser.add_argument("--version", action="version", version=f"tilefuse {tilefuse.__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (optimize_cmd, run_cmd, bench_cmd, profile_cmd, inspect_cmd, ops_cmd, conformance_cmd, export_ort_cmd, cache_cmd):
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except TilefuseError as e:
        if args.debug:
            traceback.print_exc()
        print(f"tilefuse: error: {e}", file=sys.stderr)
        return 2
    except argparse.ArgumentTypeError as e:
        print(f"tilefuse: error: {e}", file=sys.stderr)
        return 2
    except MemoryError as e:  # inputs or a reference run larger than this host holds
        if args.debug:
            traceback.print_exc()
        print(f"tilefuse: error: out of memory: {e or 'an allocation failed'}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `tilefuse ... | head`: the reader left; not an error
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
