"""Profiles: each step's measured time beside the compiler's estimate and the roofline
floor — for `tilefuse profile`, `tilefuse bench --profile` and the report.

A profile runs the plan step by step (``InferenceSession.step_times``: a CPU timer per
step, CUDA events per launch), ``warmup`` runs untimed, then ``iterations`` timed. Each
step's time is the median of its runs. Steps that launch the same kernel (the same file
and symbol: a model's repeated layers) fold into one row with its call count, its total
(the sum of its steps' medians) and the median of every call; host and select steps are
rows of their own. The estimate and the floor are the step's ``StepFacts``, recorded at
compile time (``partition/cost.py`` on the plan's target); plans without them show "-".
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np

from tilefuse.bench import Timing
from tilefuse.errors import InputError
from tilefuse.plan.model import BranchStep, HostStep, KernelStep, Plan, Step

if TYPE_CHECKING:
    from tilefuse.runtime.session import InferenceSession

FORMAT = "tilefuse-profile/1"  # the JSON's "format": what load_profile reads
COVERS_WIDTH = 48  # characters of the "ONNX nodes" column


@dataclass(frozen=True)
class Row:
    """One kernel (every step that launches it) or one host or select step, per run."""

    kind: str  # "kernel" | "host" | "select"
    name: str  # the kernel's name, or the step's label
    steps: tuple[int, ...]  # the plan's step indices it covers
    groups: tuple[int, ...]  # their partition groups
    total_ms: float  # per run: the sum of its steps' median times
    per_call_ms: float  # the median of all its calls
    estimate_ms: float | None  # per call, the cost model's (None: not recorded)
    floor_ms: float | None  # per call, the roofline alone
    bound: str  # "compute" | "memory" | ""
    onnx_ops: tuple[str, ...]
    onnx_nodes: tuple[str, ...]  # of every step, in order
    covers: str  # the short form: "MatMul+Add+Gelu (/encoder/layer.0/…)"

    @property
    def calls(self) -> int:
        return len(self.steps)

    @property
    def over_floor(self) -> float | None:
        """Measured per call / the roofline floor: how far from the hardware's limit."""
        return self.per_call_ms / self.floor_ms if self.floor_ms else None


@dataclass(frozen=True)
class Profile:
    target: str
    source_sha256: str  # of the model the plan was compiled from: the report checks it
    inputs: dict  # input name -> shape: the report checks them too
    device: str  # the device the plan was compiled for, for people
    threads: int | None  # the CPU kernels' thread count (None: GPU kernels)
    warmup: int
    iterations: int
    rows: tuple[Row, ...]  # by total time, largest first
    steps: tuple[dict, ...]  # per step run: {"step", "kind", "name", "group", "in_branch", "median_ms"}
    run: Timing | None = None  # plain runs (no timers), for comparison

    @property
    def total_ms(self) -> float:
        return sum(r.total_ms for r in self.rows)

    def as_dict(self) -> dict[str, object]:
        rows = []
        for r in self.rows:
            row = asdict(r)
            row.update(calls=r.calls, share=r.total_ms / self.total_ms if self.total_ms else 0.0,
                       over_floor=r.over_floor)
            rows.append(row)
        return {"format": FORMAT, "target": self.target, "source_sha256": self.source_sha256,
                "inputs": self.inputs, "device": self.device, "threads": self.threads,
                "warmup": self.warmup, "iterations": self.iterations, "total_ms": self.total_ms,
                "run": self.run.as_dict() if self.run else None, "rows": rows, "steps": list(self.steps)}

    def table(self) -> str:
        """The rows for people, largest total first, with their share of the total."""
        head = (f"  {'total us':>9} {'share':>6} {'calls':>5} {'per call':>9} {'est.':>8} {'floor':>8} "
                f"{'x floor':>7}  {'kernel':<40} ONNX nodes")
        lines = [f"profile on {self.target} ({self.device}), {self._threads()}: median of {self.iterations} runs "
                 f"after {self.warmup} warm-up, each step timed on its own", head]
        for r in self.rows:
            share = r.total_ms / self.total_ms if self.total_ms else 0.0
            ratio = f"{r.over_floor:.1f}" if r.over_floor is not None else "-"
            lines.append(f"  {r.total_ms * 1e3:>9.1f} {share:>6.1%} {r.calls:>5} {r.per_call_ms * 1e3:>9.1f} "
                         f"{_us(r.estimate_ms):>8} {_us(r.floor_ms):>8} {ratio:>7}  {r.name[:40]:<40} {r.covers}")
        kernels = sum(r.calls for r in self.rows if r.kind == "kernel")
        footer = (f"  {self.total_ms * 1e3:>9.1f} 100.0% {sum(r.calls for r in self.rows):>5} steps "
                  f"({kernels} kernel launches) in {len(self.rows)} rows; times in us")
        lines.append(footer)
        if self.run is not None:
            lines.append(f"plain runs (no timers): median {self.run.median_ms * 1e3:.1f} us per run "
                         f"over {self.run.repeats} runs")
        return "\n".join(lines)

    def _threads(self) -> str:
        if self.threads is None:
            return "GPU kernels"
        return f"{self.threads} thread{'s' if self.threads != 1 else ''}"


def _us(ms: float | None) -> str:
    """Microseconds with three significant digits where they are few (a tiny kernel's
    roofline floor is hundredths of a microsecond: "0.0" said nothing)."""
    if ms is None:
        return "-"
    us = ms * 1e3
    return f"{us:.1f}" if us >= 10 or us == 0 else f"{us:.3g}"


def profile(session: InferenceSession, feeds: Mapping[str, object], *, warmup: int = 3,
            iterations: int = 20) -> Profile:
    """Profile ``session`` (an ``InferenceSession``) on ``feeds``; see the module doc."""
    if warmup < 0 or iterations < 1:
        raise InputError("--warmup must be >= 0 and --iterations >= 1")
    for _ in range(warmup):
        session.step_times(feeds)
    samples: dict[int, list[float]] = {}
    for _ in range(iterations):
        for i, seconds in session.step_times(feeds):
            samples.setdefault(i, []).append(seconds * 1e3)
    plan: Plan = session.plan
    medians = {i: float(np.median(times)) for i, times in samples.items()}
    branched = _in_branch(plan.steps)
    steps = tuple({"step": i, "kind": _kind(plan.steps[i]), "name": _name(plan.steps[i]), "group": plan.steps[i].group,
                   "in_branch": i in branched, "median_ms": ms} for i, ms in medians.items())
    rows = sorted(_fold(plan, medians, samples), key=lambda r: -r.total_ms)
    device = str(plan.target_spec.get("device", {}).get("name", "")) or "device unrecorded"
    inputs = {name: list(t.shape) for name, t in plan.input_types()}
    return Profile(plan.target, plan.source_sha256, inputs, device, session.threads, warmup, iterations, tuple(rows), steps)


def _fold(plan: Plan, medians: Mapping[int, float], samples: Mapping[int, list[float]]) -> list[Row]:
    """One row per kernel, and per host or select step."""
    members: dict[tuple[str, object], list[int]] = {}
    for i in medians:
        step = plan.steps[i]
        key = ("kernel", step.kernel) if isinstance(step, KernelStep) else (_kind(step), i)
        members.setdefault(key, []).append(i)
    rows = []
    for (kind, _), indices in members.items():
        facts = [getattr(plan.steps[i], "facts", None) for i in indices]  # a select step has none
        first = facts[0]
        ops = tuple(dict.fromkeys(op for f in facts if f for op in f.onnx_ops))
        nodes = tuple(n for f in facts if f for n in f.onnx_nodes)
        calls = [t for i in indices for t in samples[i]]
        rows.append(Row(
            kind, _name(plan.steps[indices[0]]), tuple(indices), tuple(plan.steps[i].group for i in indices),
            sum(medians[i] for i in indices), float(np.median(calls)),
            _ms(first.estimated_seconds if first else None), _ms(first.floor_seconds if first else None),
            first.bound if first else "", ops, nodes,
            covers(ops, first.onnx_nodes if first else (), plan.steps[indices[0]]),
        ))
    return rows


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def _kind(step: Step) -> str:
    return "kernel" if isinstance(step, KernelStep) else "host" if isinstance(step, HostStep) else "select"


def _name(step: Step) -> str:
    if isinstance(step, KernelStep):
        return step.kernel
    if isinstance(step, HostStep):
        return f"host {step.primitive.name}"
    return f"select {step.node}"


def covers(ops: Sequence[str], nodes: Sequence[str], step: Step, width: int = COVERS_WIDTH) -> str:
    """The ONNX nodes of one call, short: their op types, then the path their names share
    (else the first name), "…" where there are more: "MatMul+Add+Gelu (/layer.0/ffn/…)"."""
    if not nodes:
        return "-" if not isinstance(step, HostStep) else step.node
    text = "+".join(ops) if ops else ""
    where = _shared_path(nodes) or nodes[0]
    where += "…" if len(nodes) > 1 else ""
    if not text:
        return where if len(where) <= width else where[: width - 1] + "…"
    room = max(8, width - len(where) - 3)  # the ops give way first: the place says which layer
    text = text if len(text) <= room else text[: room - 1] + "…"
    out = f"{text} ({where})"
    return out if len(out) <= width else out[: width - 2] + "…)"


def _shared_path(names: Sequence[str]) -> str:
    """The prefix all ``names`` share, cut after its last "/" or "." (empty if short)."""
    prefix = names[0]
    for name in names[1:]:
        while not name.startswith(prefix):
            prefix = prefix[:-1]
    cut = max(prefix.rfind("/"), prefix.rfind("."))
    return prefix[: cut + 1] if cut >= 3 else ""


def _in_branch(steps: Sequence[Step]) -> set[int]:
    """The steps inside a run-time branch: their groups are the branch's own partition's."""
    inside: set[int] = set()
    for i, step in enumerate(steps):
        if isinstance(step, BranchStep):
            inside.update(range(i + 1, i + 1 + step.then_steps + step.else_steps))
    return inside


def load_profile(path: str | Path) -> dict:
    """A profile's JSON (``Profile.as_dict``) read back; InputError if it is not one."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise InputError(f"profile {path}: {e.strerror or e}") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"profile {path}: not JSON ({e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("steps"), list):
        raise InputError(f"profile {path}: not a tilefuse profile (write one with `tilefuse profile PLAN --json FILE`)")
    for s in data["steps"]:
        if not (isinstance(s, dict) and isinstance(s.get("group"), int) and isinstance(s.get("median_ms"), (int, float))
                and isinstance(s.get("in_branch"), bool)):
            raise InputError(f"profile {path}: a step without its group, median_ms and in_branch: {str(s)[:60]}")
    return data
