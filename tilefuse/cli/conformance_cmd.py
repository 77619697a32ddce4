"""`tilefuse conformance`: the ONNX backend node tests through tilefuse."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from tqdm import tqdm

from tilefuse.conformance import run_conformance


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("conformance", help="run the ONNX backend node tests through tilefuse")
    p.add_argument("--target", default="reference", help="where the compiled cases run (default: reference)")
    p.add_argument("-k", "--filter", default=None, help="only cases whose name contains this")
    p.add_argument("--json", metavar="FILE", help="write every case's result to FILE")
    p.add_argument("--failures", action="store_true", help="list every failing case with its error")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    progress = lambda cases: tqdm(cases, desc="node tests", unit="case", leave=False)  # noqa: E731
    report = run_conformance(args.target, args.filter, progress=progress)
    print(f"{'op':<28} {'pass':>5} {'fail':>5} {'skip':>5}")
    for op, row in report.per_op().items():
        if row["pass"] or row["fail"]:
            print(f"{op:<28} {row['pass']:>5} {row['fail']:>5} {row['skip']:>5}")
    failures = [r for r in report.results if r.status == "fail"]
    if failures:
        print(f"\nfailing cases ({len(failures)}):")
        for r in failures if args.failures else failures[:20]:
            print(f"  {r.name}: {r.detail[:240]}")
        if not args.failures and len(failures) > 20:
            print(f"  ... {len(failures) - 20} more (--failures lists all)")
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=1))
    claimed_cases = report.count("pass") + report.count("fail")
    rate = report.count("pass") / claimed_cases if claimed_cases else 0.0
    print(f"\n{report.claimed_ops} ops claimed; {rate:.1%} of the cases using only claimed ops pass")
    print(report.summary_line())
    return 0
