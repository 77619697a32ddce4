"""The ONNX backend node suite through the frontend and the reference executor.

The pass count may only go up: raise BASELINE when a change makes more cases pass.
"""
import json
from pathlib import Path

import pytest

from tilefuse.conformance import run_conformance

BASELINE = json.loads((Path(__file__).parent / "baseline.json").read_text())


@pytest.fixture(scope="module")
def report():
    return run_conformance("reference")


def test_pass_count_does_not_go_down(report):
    assert report.count("pass") >= BASELINE["reference"]["passed"], report.summary_line()


def test_claims_at_least_120_ops(report):
    assert report.claimed_ops >= 120


def test_at_least_97_percent_of_claimed_cases_pass(report):
    claimed = report.count("pass") + report.count("fail")
    assert claimed > 1000, "the suite shrank: is the onnx pin right?"
    assert report.count("pass") / claimed >= 0.97, report.summary_line()


def test_every_failure_carries_its_error(report):
    for r in report.results:
        if r.status == "fail":
            assert r.detail, r.name
        if r.status == "skip":
            assert r.detail, r.name


def test_a_case_without_a_model_or_data_is_a_failure_with_its_reason():
    """onnx's other test kinds (``load_model_tests(kind="real")``) name a model on disk
    and carry neither the model nor its data: a failure that says so, not a crash."""
    from onnx.backend.test.case.test_case import TestCase

    from tilefuse.conformance.runner import TARGETS, run_case

    case = TestCase(name="test_on_disk", model_name="on_disk", url=None, model_dir="/nowhere", model=None,
                    data_sets=None, kind="real", rtol=1e-3, atol=1e-7)
    result = run_case(case, TARGETS["reference"])
    assert (result.name, result.status) == ("test_on_disk", "fail")
    assert "no model" in result.detail
