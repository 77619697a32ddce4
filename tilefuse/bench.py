"""Timing: warm-up, then timed runs for a count and a duration; the statistics serving
people read (trtexec's set) — for `tilefuse bench` and the benchmarks."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p10_ms: float
    p90_ms: float
    repeats: int  # the timed runs
    mean_ms: float = 0.0
    p95_ms: float = 0.0
    p99_ms: float = 0.0
    min_ms: float = 0.0
    max_ms: float = 0.0
    seconds: float = 0.0  # wall time of the timed runs, together
    warmup: int = 0

    @property
    def per_second(self) -> float:
        """Runs per second over the timed runs (one at a time, as measured)."""
        return self.repeats / self.seconds if self.seconds > 0 else 0.0

    @staticmethod
    def of(times_ms: list[float], seconds: float = 0.0, warmup: int = 0) -> "Timing":
        a = np.asarray(times_ms, dtype=np.float64)
        p10, p50, p90, p95, p99 = np.percentile(a, [10, 50, 90, 95, 99])
        return Timing(float(p50), float(p10), float(p90), len(a), float(a.mean()), float(p95), float(p99),
                      float(a.min()), float(a.max()), seconds or float(a.sum()) / 1e3, warmup)

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "per_second": self.per_second}

    def __str__(self) -> str:
        return f"{self.median_ms:.3f} ms (p10 {self.p10_ms:.3f}, p90 {self.p90_ms:.3f}, n={self.repeats})"

    def report(self) -> str:
        """Every figure, for people: the lines `tilefuse bench` prints."""
        return (f"median {self.median_ms:.3f} ms, mean {self.mean_ms:.3f}, min {self.min_ms:.3f}, max {self.max_ms:.3f}\n"
                f"    p90 {self.p90_ms:.3f}, p95 {self.p95_ms:.3f}, p99 {self.p99_ms:.3f} ms; "
                f"{self.per_second:.1f} runs/s over {self.repeats} runs in {self.seconds:.2f} s "
                f"(after {self.warmup} warm-up)")


def measure(fn: Callable[[], object], *, warmup: int = 3, repeats: int = 20, min_seconds: float = 0.5,
            max_repeats: int | None = None) -> Timing:
    """Run ``fn`` ``warmup`` times, then until it has run at least ``repeats`` times and
    for at least ``min_seconds`` (at most ``max_repeats`` runs, default 10 x ``repeats``)."""
    for _ in range(warmup):
        fn()
    cap = max_repeats if max_repeats is not None else max(10 * repeats, repeats)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeats or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
        if len(times) >= cap:
            break
    return Timing.of(times, time.perf_counter() - start, warmup)
