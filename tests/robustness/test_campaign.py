"""The robustness campaign as a test: no crash, no traceback, no silent wrong answer.

CI runs a seeded sample of about 400 cases (a minute or two on two cores: the plan and
feed cases share two compiled base plans); ``-m slow`` runs the whole campaign, every
hand-made case and enough random ones for at least 1,000. The seed comes from
$TILEFUSE_ROBUSTNESS_SEED (default 0), so a failure repeats with
``python -m tests.robustness.campaign --cases N --seed S --only CASE_ID``.
"""
from __future__ import annotations

import os

import pytest

from tests.robustness import campaign

SEED = int(os.environ.get("TILEFUSE_ROBUSTNESS_SEED", "0"))
SAMPLE = 400
FULL = int(os.environ.get("TILEFUSE_ROBUSTNESS_CASES", "1200"))


def _run(total: int, tmp_path, config) -> None:
    cases = campaign.build_cases(total, SEED)
    results = campaign.run(cases, workers=min(2, os.cpu_count() or 1))
    line = campaign.summary(results)
    config.robustness_summaries = [*getattr(config, "robustness_summaries", []), line]
    campaign.write_json(results, tmp_path / "robustness-failures.json", SEED, total)
    assert len(results) == len(cases)
    failed = [r for r in results if r["verdict"] in campaign.FAILED]
    assert not failed, (f"{line}\n{campaign.report(results)}\nrepeat one with: python -m tests.robustness.campaign "
                        f"--cases {total} --seed {SEED} --only {failed[0]['id']}")


def test_sample(tmp_path, request):
    _run(SAMPLE, tmp_path, request.config)


@pytest.mark.slow
def test_campaign(tmp_path, request):
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("the full campaign (minutes) runs with -m slow")
    assert FULL >= 1000
    _run(FULL, tmp_path, request.config)
