"""The harness judged on itself: the classifier on made-up outcomes, the isolation on
probes that crash, hang, raise or kill their worker, the CLI rules, and the generators'
determinism and validity. None of this depends on tilefuse being free of the defects the
campaign looks for."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from tests.robustness import campaign, gen_feeds, gen_graphs, gen_plans
from tests.robustness.cases import Expect, FeedCase, ModelCase, Outcome, PlanCase, ProbeCase, make_feeds
from tests.robustness.classify import Verdict, classify, compare_array
from tests.robustness.execute import cli_outcome
from tests.robustness.pool import run_cases

Y = [("y", np.array([1.0, -2.0, 3.0], np.float32))]


def ok(outputs=Y) -> Outcome:
    return Outcome("ok", outputs=outputs)


def refused(message: str = "no") -> Outcome:
    return Outcome("clean", error_type="Err", message=message)


@pytest.mark.parametrize("expect", list(Expect))
def test_correct_only_when_onnxruntime_ran_and_matched(expect):
    """Whatever the expectation, tilefuse running is never 'correct' unless onnxruntime ran
    the same input and gave the same answer."""
    for oracle in (refused(), Outcome("crash", signal=11), Outcome("timeout", seconds=60)):
        for spec in (True, False, None):
            assert classify(expect, ok(), oracle, spec).verdict is not Verdict.CORRECT
    if expect is not Expect.ERROR:
        assert classify(expect, ok(), ok()).verdict is Verdict.CORRECT


def test_running_what_must_fail_is_wrong():
    assert classify(Expect.ERROR, ok(), None).verdict is Verdict.WRONG
    assert classify(Expect.ORT, ok(), refused()).verdict is Verdict.WRONG
    assert classify(Expect.SPEC, ok(), refused(), spec_valid=False).verdict is Verdict.WRONG
    # onnxruntime refuses a model the checker accepts: nothing to compare with
    assert classify(Expect.SPEC, ok(), refused(), spec_valid=True).verdict is Verdict.UNVERIFIED
    # onnxruntime crashed or hung: it said nothing about the input
    assert classify(Expect.ORT, ok(), Outcome("crash", signal=11)).verdict is Verdict.UNVERIFIED


def test_clean_errors_refusals_and_broken_cases():
    for expect in (Expect.ERROR, Expect.EITHER, Expect.ORT, Expect.SPEC):
        assert classify(expect, refused(), None).verdict is Verdict.CLEAN_ERROR
    assert classify(Expect.RESULT, refused(), ok()).verdict is Verdict.REFUSED
    # a RESULT case onnxruntime cannot run is the harness's fault, not a refusal or a pass
    assert classify(Expect.RESULT, refused(), refused()).verdict is Verdict.HARNESS
    assert classify(Expect.RESULT, ok(), refused()).verdict is Verdict.HARNESS
    assert classify(Expect.EITHER, ok(), refused()).verdict is Verdict.HARNESS
    assert classify(Expect.EITHER, Outcome("harness", message="bug"), None).verdict is Verdict.HARNESS
    assert classify(Expect.EITHER, ok(), Outcome("harness", message="bug")).verdict is Verdict.HARNESS


def test_failures_of_tilefuse_itself():
    cases = {"crash": Verdict.CRASH, "timeout": Verdict.TIMEOUT, "exception": Verdict.TRACEBACK, "unclean": Verdict.UNCLEAN}
    for status, verdict in cases.items():
        for expect in Expect:
            assert classify(expect, Outcome(status, signal=11), ok()).verdict is verdict


def test_comparison():
    want = np.array([1.0, -2.0, 3.0, np.nan, np.inf, -np.inf], np.float32)
    assert compare_array(want.copy(), want) == ""
    assert compare_array(want + np.float32(1e-4), want) == ""  # within 1e-4 x scale 3
    assert "max abs error" in compare_array(want + np.float32(1e-3), want)
    assert "NaN" in compare_array(np.nan_to_num(want, nan=0.0, posinf=np.inf, neginf=-np.inf), want)
    flipped = want.copy()
    flipped[4] = -np.inf
    assert "inf" in compare_array(flipped, want)
    assert "dtype" in compare_array(want.astype(np.float64), want)
    assert "shape" in compare_array(want[:3], want)
    assert "not a numpy array" in compare_array([1.0], want)
    ints = np.arange(5)
    assert compare_array(ints.copy(), ints) == "" and "1 of 5" in compare_array(ints + (ints == 2), ints)
    assert "outputs" in classify(Expect.RESULT, ok([("z", Y[0][1])]), ok()).detail


def test_cli_rules():
    assert cli_outcome("run", 0, "").status == "ok"
    assert cli_outcome("run", 2, "tilefuse: error: bad input\n").status == "clean"
    assert cli_outcome("run", 2, "warning: x\ntilefuse: error: bad input\n").status == "unclean"
    assert cli_outcome("run", 2, "tilefuse: error: a\nb\n").status == "unclean"
    assert cli_outcome("run", 1, "no traceback\n").status == "unclean"
    tb = ('Traceback (most recent call last):\n  File "/x/tilefuse/feeds.py", line 9, in check\n'
          "TypeError: bad\n")
    got = cli_outcome("run", 1, tb)
    assert (got.status, got.error_type, got.where) == ("exception", "TypeError", "tilefuse/feeds.py:9 in check")
    assert cli_outcome("run", 2, "tilefuse: error: x\n" + tb).status == "exception"
    assert cli_outcome("run", -11, "").status == "crash"


def test_isolation_probes():
    """Each probe through the real pool: crashes, hangs and dying workers are classified,
    and the cases after a dead worker still run."""
    probes = {"segv": Verdict.CRASH, "abort": Verdict.CRASH, "kill": Verdict.CRASH, "exit": Verdict.CRASH,
              "sleep": Verdict.TIMEOUT, "raise": Verdict.TRACEBACK, "alloc": Verdict.TRACEBACK,
              "clean": Verdict.CLEAN_ERROR, "ok": Verdict.CORRECT, "nan": Verdict.WRONG, "wrongname": Verdict.WRONG,
              "kill-worker": Verdict.CRASH, "heap": Verdict.CRASH}
    cases = [ProbeCase(f"probe/{a}", "probe", Expect.EITHER, a, action=a, timeout=3) for a in probes]
    cases.append(ProbeCase("probe/ok-after", "probe", Expect.EITHER, "after a dead worker", action="ok"))
    cases.append(ProbeCase("probe/no-reference", "probe", Expect.EITHER, "reference fails", action="ok", oracle="fail"))
    results = {r["id"]: r for r in run_cases(cases, workers=2)}
    assert len(results) == len(cases)
    for action, verdict in probes.items():
        assert results[f"probe/{action}"]["verdict"] == verdict.value, results[f"probe/{action}"]
    assert "SIGSEGV" in results["probe/segv"]["detail"] and "probe segv" in results["probe/segv"]["detail"]
    assert "MemoryError" in results["probe/alloc"]["detail"]  # the address-space limit holds
    assert results["probe/kill-worker"]["where"] == "worker"
    assert "teardown" in results["probe/heap"]["detail"]  # damage found when the child frees it
    assert results["probe/ok-after"]["verdict"] == "correct"
    assert results["probe/no-reference"]["verdict"] == "harness"


def test_generators_are_deterministic_and_distinct():
    a, b = campaign.build_cases(400, seed=3), campaign.build_cases(400, seed=3)
    assert [pickle.dumps(x) for x in a] == [pickle.dumps(y) for y in b]  # (NaN params: != by value)
    c = campaign.build_cases(400, seed=4)
    random_ids = lambda cases: {x.id for x in cases if x.family in ("model.flip", "graph", "plan.random")}  # noqa: E731
    assert random_ids(a) != random_ids(c)
    graphs_a = {x.id: x.files for x in a if x.family == "graph"}
    graphs_c = {x.id: x.files for x in c if x.family == "graph"}
    assert any(graphs_a[k] != graphs_c[k] for k in graphs_a.keys() & graphs_c.keys())


def test_campaign_shape():
    full = campaign.build_cases(1200, seed=0)
    assert len(full) >= 1000
    families = {c.family for c in full}
    assert {"model.truncate", "model.flip", "model.fault", "model.args", "extdata", "plan", "plan.random", "feeds",
            "graph"} <= families
    assert any(c.cli for c in full) and any(isinstance(c, FeedCase) and c.cli for c in full)
    for c in full:
        if isinstance(c, PlanCase):
            assert c.mutation in gen_plans.MUTATIONS, c.id
        if isinstance(c, FeedCase):
            assert c.recipe in gen_feeds.RECIPES, c.id
    quick = campaign.build_cases(400, seed=0)
    assert {c.family for c in quick if not c.cli} >= {f for f in families if not f.endswith(".cli")} - {"extdata.flip"}
    # every kind of case has positive controls in the sample, so "all clean errors" would show
    assert {c.kind for c in quick if c.expect is Expect.RESULT} >= {"model", "plan", "feed"}


def test_random_graphs_are_valid_and_run_in_onnxruntime():
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4
    for case in gen_graphs.random_graphs(seed=0, count=120):
        assert isinstance(case, ModelCase) and case.expect is Expect.RESULT
        feeds = make_feeds(case.inputs, case.feed_seed)
        assert all(np.all(v != 0) for v in feeds.values() if v.dtype.kind == "f")
        sess = ort.InferenceSession(case.files[0][1], so, providers=["CPUExecutionProvider"])
        sess.run(None, feeds)
