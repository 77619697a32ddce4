"""The ONNX backend node suite, built in memory by the installed onnx package.

Each case is imported with its test inputs' shapes, run on a target, and compared
with the expected outputs using the case's own tolerances. A case is *skipped* only
when it uses an op tilefuse does not claim; every other outcome is a pass or a
failure with its error, so nothing fails silently.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable

import numpy as np
import onnx

from tilefuse.errors import TilefuseError
from tilefuse.frontend.context import NotConstantError
from tilefuse.frontend.coverage import find_unsupported
from tilefuse.frontend.importer import import_onnx
from tilefuse.frontend.loader import upgrade_opset
from tilefuse.frontend.shapes import runtime_inputs
from tilefuse.ir.graph import Graph
from tilefuse.reference import run_graph

if TYPE_CHECKING:
    from onnx.backend.test.case.test_case import TestCase

# A target runs an imported graph: (graph, feeds) -> outputs by name.
Runner = Callable[[Graph, dict[str, np.ndarray]], dict[str, np.ndarray]]
def _run_on_cpu(graph: Graph, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The whole pipeline: partition, lower, C code, plan, runtime."""
    from tilefuse.compiler import compile_graph
    from tilefuse.runtime import InferenceSession
    from tilefuse.target import CPU

    session = InferenceSession(compile_graph(graph, CPU).plan)
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))


TARGETS: dict[str, Runner] = {"reference": run_graph, "cpu": _run_on_cpu}


@dataclass
class CaseResult:
    name: str
    ops: tuple[str, ...]
    status: str  # "pass" | "fail" | "skip"
    detail: str = ""


@dataclass
class Report:
    target: str
    results: list[CaseResult] = field(default_factory=list)

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def claimed_ops(self) -> int:
        from tilefuse.frontend import registry

        return len({(e.domain, e.op_type) for e in registry.entries()})

    def per_op(self) -> dict[str, dict[str, int]]:
        table: dict[str, dict[str, int]] = {}
        for r in self.results:
            for op in r.ops:
                row = table.setdefault(op, {"pass": 0, "fail": 0, "skip": 0})
                row[r.status] += 1
        return dict(sorted(table.items()))

    def summary_line(self) -> str:
        return f"{self.count('pass')} passed, {self.count('fail')} failed, {self.count('skip')} skipped"

    def to_json(self) -> dict[str, object]:
        return {
            "target": self.target,
            "claimed_ops": self.claimed_ops,
            "passed": self.count("pass"),
            "failed": self.count("fail"),
            "skipped": self.count("skip"),
            "per_op": self.per_op(),
            "cases": [vars(r) for r in self.results],
        }


def load_cases(pattern: str | None = None) -> list[TestCase]:
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    if pattern:
        cases = [c for c in cases if pattern in c.name]
    return sorted(cases, key=lambda c: c.name)


def run_conformance(target: str = "reference", pattern: str | None = None, progress: Callable[[Iterable], Iterable] | None = None) -> Report:
    if target not in TARGETS:
        raise TilefuseError(f"unknown conformance target {target!r}; known: {sorted(TARGETS)}")
    report = Report(target)
    cases = load_cases(pattern)
    for case in (progress(cases) if progress else cases):
        report.results.append(run_case(case, TARGETS[target]))
    return report


def run_case(case: TestCase, runner: Runner) -> CaseResult:
    model, name = case.model, case.name
    if model is None or not case.data_sets:  # onnx's node cases are built in memory, with both
        return CaseResult(name, (), "fail", "the case carries no model or no test data")
    ops = tuple(sorted({n.op_type for n in model.graph.node}))
    try:
        unsupported = find_unsupported(model, any_opset=True) or find_unsupported(upgrade_opset(model))
    except TilefuseError as e:
        return CaseResult(name, ops, "fail", f"{type(e).__name__}: {e}")
    if unsupported:
        return CaseResult(name, ops, "skip", "; ".join(str(u) for u in unsupported))
    inputs, expected = case.data_sets[0]
    names = [vi.name for vi in runtime_inputs(model)]
    feeds = {n: _array(a) for n, a in zip(names, inputs)}
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            got = _import_and_run(model, feeds, runner)
    except Exception as e:  # every failure is reported with its error, none is hidden
        return CaseResult(name, ops, "fail", f"{type(e).__name__}: {e}"[:500])
    out_names = [o.name for o in model.graph.output]
    for out_name, want in zip(out_names, expected):
        problem = compare(got[out_name], _array(want), case.rtol, case.atol)
        if problem:
            return CaseResult(name, ops, "fail", f"output {out_name!r}: {problem}")
    return CaseResult(name, ops, "pass")


def _import_and_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], runner: Runner) -> dict[str, np.ndarray]:
    """Import with the feeds' shapes; inputs that must be compile-time constants
    (a Reshape's shape, a Slice's starts, ...) are bound to the test's values."""
    shapes = {n: a.shape for n, a in feeds.items()}
    constants: dict[str, np.ndarray] = {}
    for _ in range(len(feeds) + 1):
        try:
            graph = import_onnx(model, shapes, constants=constants)
            break
        except NotConstantError as e:
            new = [n for n in e.graph_inputs if n in feeds and n not in constants]
            if not new:
                raise
            constants.update({n: feeds[n] for n in new})
    runtime = {n: a for n, a in feeds.items() if n not in constants}
    return runner(graph, runtime)


def _array(a: object) -> np.ndarray:
    if isinstance(a, onnx.TensorProto):
        from onnx import numpy_helper

        return numpy_helper.to_array(a)
    return np.asarray(a)


def compare(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> str:
    """Why ``got`` does not match ``want`` (dtype, shape, values), or '' if it does."""
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}"
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    if want.dtype.kind in "fc" or want.dtype.name == "bfloat16":
        g, w = got.astype(np.float64), want.astype(np.float64)
        ok = np.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        if not ok.all():
            err = np.nanmax(np.abs(g - w)[~ok]) if (~ok).any() else 0
            return f"{int((~ok).sum())}/{ok.size} values differ, max abs error {err:.3g}"
        return ""
    if not np.array_equal(got, want):
        return f"{int((got != want).sum())}/{got.size} values differ"
    return ""
