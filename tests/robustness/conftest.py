"""Shows each campaign's summary line at the end of the pytest run, pass or fail
(test_campaign.py leaves them on the config as ``robustness_summaries``)."""
from __future__ import annotations


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001: pytest's hook
    for line in getattr(terminalreporter.config, "robustness_summaries", []):
        terminalreporter.write_line(line)
