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
