"""Why a pattern does not apply to a set of primitives.

A matcher answers with its typed match or with a ``Refusal``; the reason is a sentence
for people (``--explain`` prints the partitioner's, a staged kernel's match keeps the
specialised patterns'), never parsed.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Refusal:
    """A pattern that does not apply, and why."""

    reason: str

