"""Timing: warm-up, repeats, median and spread — for `tilefuse bench` and the benchmarks."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p10_ms: float
    p90_ms: float
    repeats: int

    def __str__(self) -> str:
        return f"{self.median_ms:.3f} ms (p10 {self.p10_ms:.3f}, p90 {self.p90_ms:.3f}, n={self.repeats})"


def measure(fn: Callable[[], object], *, warmup: int = 3, repeats: int = 20, min_seconds: float = 0.5) -> Timing:
    """Run ``fn`` ``warmup`` times, then at least ``repeats`` times and ``min_seconds``."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeats or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
        if len(times) >= 10 * repeats:
            break
    q = statistics.quantiles(times, n=10) if len(times) >= 2 else [times[0]] * 9
    return Timing(statistics.median(times), q[0], q[-1], len(times))
