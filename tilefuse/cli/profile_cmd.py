"""`tilefuse profile PLAN_OR_MODEL`: each kernel's measured time beside its estimate and
its roofline floor, identical kernels folded (tilefuse/profile.py)."""
from __future__ import annotations

import argparse
from dataclasses import replace

from tilefuse.bench import measure
from tilefuse.cli.bench_cmd import add_plan_args, open_session, write_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="time each kernel of a plan, beside its estimate and roofline floor")
    add_plan_args(p)
    p.add_argument("--warmup", type=int, default=3, metavar="N", help="untimed runs first (default 3)")
    p.add_argument("--iterations", type=int, default=20, metavar="N", help="timed runs (default 20): each "
                   "step's time is its median")
    p.add_argument("--threads", type=int, help="threads of a CPU plan's kernels (default: OMP_NUM_THREADS, else "
                   "one per core)")
    p.add_argument("--json", metavar="FILE", help="write the profile as JSON (for `optimize --report ... --profile`)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tilefuse.profile import profile

    _, session, feeds, _ = open_session(args)
    prof = profile(session, feeds, warmup=args.warmup, iterations=args.iterations)
    # plain runs beside it: what the per-step timers cost
    plain = measure(lambda: session.run(None, feeds), warmup=1, repeats=args.iterations, min_seconds=0)
    prof = replace(prof, run=plain)
    print(prof.table())
    if args.json:
        write_json(args.json, prof.as_dict())
    return 0
