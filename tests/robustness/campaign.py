"""The robustness campaign: hostile cases run on worker processes, each classified.

    python -m tests.robustness.campaign --cases 1200 --seed 0 --json failures.json
    python -m tests.robustness.campaign --cases 1200 --seed 0 --only plan/lm/symbol-abort

prints one summary line (``robustness: N cases: ... clean errors, ... correct, 0 crashes,
0 tracebacks, 0 wrong``), the failures grouped by cause, and writes every failure (with
its traceback or stderr) as JSON. ``--only`` re-runs the named cases of the same
``--cases``/``--seed`` campaign and shows all about each.

The cases: every hand-made case (model faults, compile arguments, external data, plan
corruptions, bad feeds) and, for the rest of ``--cases``, seeded random ones (model
truncations and byte flips, plan flips and truncations, external-data flips, random
graphs against onnxruntime). Below the number of hand-made cases, a seeded stratified
sample of them is taken instead (the CI sample). A few of each kind also go through the
CLI (``--cli``).
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from tests.robustness import gen_external, gen_feeds, gen_graphs, gen_models, gen_plans
from tests.robustness.cases import Case, FeedCase, ModelCase, PlanCase
from tests.robustness.classify import Verdict
from tests.robustness.pool import run_cases

# Shares of the random part of a campaign.
RANDOM_SHARES = {"graph": 0.2, "truncate": 0.15, "flip": 0.3, "plan": 0.33, "extdata": 0.02}
FAILED = [v.value for v in Verdict if v.failed]


def handmade() -> list[Case]:
    return [*gen_models.faults(), *gen_models.arguments(), *gen_external.handmade(), *gen_plans.handmade(),
            *gen_feeds.handmade()]


def random_cases(seed: int, count: int) -> list[Case]:
    n = {k: int(round(v * count)) for k, v in RANDOM_SHARES.items()}
    return [*gen_graphs.random_graphs(seed, n["graph"]), *gen_models.truncations(seed, n["truncate"]),
            *gen_models.flips(seed, n["flip"]), *gen_plans.random_flips(seed, n["plan"]),
            *gen_external.data_flips(seed, n["extdata"])]


def build_cases(total: int, seed: int = 0, cli: int | None = None) -> list[Case]:
    """``total`` cases (about: duplicates among random flips are dropped), ``cli`` of them
    (default total // 30, at least 4) again through the CLI."""
    fixed = handmade()
    if total >= len(fixed) + 50:
        cases = fixed + random_cases(seed, total - len(fixed))
    else:
        cases = _stratified(fixed, int(total * 0.7), seed) + random_cases(seed, total - int(total * 0.7))
    cases += cli_cases(cases, max(4, total // 30) if cli is None else cli, seed)
    ids = [c.id for c in cases]
    duplicates = [i for i, n in collections.Counter(ids).items() if n > 1]
    assert not duplicates, f"case ids must be unique: {duplicates[:5]}"
    return cases


def _stratified(cases: list[Case], count: int, seed: int) -> list[Case]:
    """``count`` cases, each family in proportion, its controls always in."""
    rng = np.random.default_rng([seed, 17])
    by_family: dict[str, list[Case]] = collections.defaultdict(list)
    for c in cases:
        by_family[c.family].append(c)
    out = []
    for family, members in by_family.items():
        controls = [c for c in members if "control" in c.id]
        rest = [c for c in members if "control" not in c.id]
        take = max(0, round(count * len(members) / len(cases)) - len(controls))
        picked = sorted(rng.choice(len(rest), size=min(take, len(rest)), replace=False))
        out += controls + [rest[i] for i in picked]
    return out


def cli_cases(cases: list[Case], count: int, seed: int) -> list[Case]:
    """``count`` of the cases again through ``python -m tilefuse``: models by path (inspect,
    optimize, run), plans (run), feeds that .npy files can carry (run)."""
    def eligible(c: Case) -> bool:
        if c.family not in ("model.fault", "model.args", "extdata", "plan", "graph"):
            return False  # random flips and cuts mostly stop where the API stops: parsing
        if isinstance(c, ModelCase):
            if any("\0" in s.name or "=" in s.name for s in c.inputs):
                return False  # no argv holds a NUL; --input NAME=FILE splits at the first '='
            return c.entry == "path" and not c.compile_kwargs and (
                c.shapes is None or (isinstance(c.shapes, dict) and all(isinstance(v, int) and not isinstance(v, bool)
                                                                      for v in c.shapes.values())))
        return isinstance(c, PlanCase)

    pool = [c for c in cases if eligible(c)]
    rng = np.random.default_rng([seed, 23])
    feeds = list(gen_feeds.cli_sample())
    n_feeds = min(len(feeds), max(1, count // 5))
    picked = sorted(rng.choice(len(pool), size=min(count - n_feeds, len(pool)), replace=False))
    out: list[Case] = [dataclasses.replace(pool[i], id=pool[i].id + "/cli", family=pool[i].family + ".cli", cli=True)
                       for i in picked]
    out += [feeds[i] for i in sorted(rng.choice(len(feeds), size=n_feeds, replace=False))]
    return out


# -- reporting ------------------------------------------------------------------------------
def summary(results: list[dict[str, Any]]) -> str:
    counts = collections.Counter(r["verdict"] for r in results)
    main = [("clean error", "clean errors"), ("correct", "correct"), ("crash", "crashes"), ("traceback", "tracebacks"),
            ("wrong", "wrong")]
    parts = [f"{counts.get(v, 0)} {label}" for v, label in main]
    parts += [f"{counts[v.value]} {v.value}" for v in Verdict if v.value not in dict(main) and counts.get(v.value)]
    return f"robustness: {len(results)} cases: " + ", ".join(parts)


def cause(r: dict[str, Any]) -> str:
    """What a failure's repeats have in common: its verdict, family and where or why."""
    family = r["family"].split(".")[0] + (".cli" if r.get("cli") else "")
    if r["verdict"] in ("traceback", "crash", "timeout") and r.get("where"):
        what = f"{r.get('error_type') or r['detail'].split(' in ')[0]} at {r['where']}"
    else:
        what = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", r["detail"])[:160]
    return f"{r['verdict']}: {family}: {what}"


def grouped(results: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    groups: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in results:
        if r["verdict"] in FAILED:
            groups[cause(r)].append(r)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))


def report(results: list[dict[str, Any]], examples: int = 3) -> str:
    lines = []
    for key, members in grouped(results):
        lines.append(f"{len(members):4d}  {key}")
        for r in members[:examples]:
            lines.append(f"        {r['id']}: {r['note']} -> {r['detail'][:200]}")
    return "\n".join(lines)


def write_json(results: list[dict[str, Any]], path: Path, seed: int, total: int) -> None:
    data = {
        "summary": summary(results), "seed": seed, "cases": total,
        "counts": collections.Counter(r["verdict"] for r in results),
        "causes": [{"cause": k, "count": len(v), "ids": [r["id"] for r in v]} for k, v in grouped(results)],
        "failures": [r for r in results if r["verdict"] in FAILED],
        "all": [{k: r.get(k) for k in ("id", "verdict", "seconds", "detail")} for r in results],
    }
    path.write_text(json.dumps(data, indent=1, default=str))


def run(cases: Iterable[Case], workers: int = 2, verbose: bool = False) -> list[dict[str, Any]]:
    cases = list(cases)
    start = time.monotonic()

    def progress(done: int, r: dict[str, Any]) -> None:
        if verbose or r["verdict"] in FAILED:
            print(f"[{done}/{len(cases)} {time.monotonic() - start:.0f}s] {r['verdict']}: {r['id']}: {r['detail'][:160]}",
                  file=sys.stderr, flush=True)

    return run_cases(cases, workers=workers, progress=progress)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.robustness.campaign", description=__doc__.split("\n")[0])
    p.add_argument("--cases", type=int, default=1200, help="about how many cases (default 1200)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--cli", type=int, default=None, help="how many cases also go through the CLI (default cases/30)")
    p.add_argument("--json", type=Path, default=Path(tempfile.gettempdir()) / "tilefuse-robustness.json",
                   help="where to write the failures (default: $TMPDIR/tilefuse-robustness.json)")
    p.add_argument("--only", nargs="*", help="run only these case ids, and show everything about them")
    p.add_argument("--list", action="store_true", help="list the cases and stop")
    p.add_argument("-v", "--verbose", action="store_true", help="print every case as it ends")
    args = p.parse_args(argv)
    cases = build_cases(args.cases, args.seed, args.cli)
    if args.list:
        for c in cases:
            print(f"{c.id}\t{c.expect.value}\t{c.note}")
        return 0
    if args.only:
        wanted = set(args.only)
        cases = [c for c in cases if c.id in wanted]
        missing = wanted - {c.id for c in cases}
        if missing:
            print(f"no such case(s) in this campaign: {sorted(missing)}", file=sys.stderr)
            return 2
        for r in run(cases, args.workers):
            print(json.dumps(r, indent=1, default=str))
        return 0
    start = time.monotonic()
    results = run(cases, args.workers, args.verbose)
    print(report(results))
    write_json(results, args.json, args.seed, args.cases)
    print(f"({time.monotonic() - start:.0f} s, failures in {args.json})")
    print(summary(results))
    return 1 if any(r["verdict"] in FAILED for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
