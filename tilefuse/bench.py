"""Timing: warm-up, then timed runs for a count and a duration; the statistics serving
people read (trtexec's set) — for `tilefuse bench` and the benchmarks."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

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


def settle(window_s: float = 0.005, most_s: float = 0.5) -> None:
    """Wait until this process's other threads have gone quiet: two windows of
    ``window_s`` in a row in which the process used less than a fifth of a window of CPU
    (at most ``most_s``). A runtime's pool spins after its run (onnxruntime's for about 30
    ms on a 2-core box); a runtime timed next would share the cores with those spinners,
    which no server running one model does."""
    quiet, end = 0, time.perf_counter() + most_s
    while quiet < 2 and time.perf_counter() < end:
        c0 = time.process_time()
        time.sleep(window_s)
        quiet = quiet + 1 if time.process_time() - c0 < window_s / 5 else 0


def measure_interleaved(fns: Sequence[Callable[[], object]], *, warmup: int = 3, repeats: int = 20,
                        min_seconds: float = 0.5, max_repeats: int | None = None, block_seconds: float = 0.2,
                        clock: Callable[[], float] = time.perf_counter,
                        between: Callable[[], None] = settle) -> list[Timing]:
    """Time several runtimes on one machine fairly: ``fns`` run in turn, a block of about
    ``block_seconds`` of runs each, round after round, until each has run at least
    ``repeats`` timed runs for at least ``min_seconds`` in all (or has reached
    ``max_repeats``, default 10 x ``repeats``); one that has stops there, mid-block.
    A machine whose speed drifts (a shared or virtual one moves by tens of percent
    within a minute) then moves every runtime alike, where timing one after the other
    would credit the drift to whichever ran in the fast minute. Before each block,
    ``between()`` waits for the threads of the runtime before it to stop spinning
    (``settle``), and the block's first run is not timed: it pays for the caches the
    other left holding its own data. A server running one model has neither. ``warmup``
    untimed runs of each come first (one at least: its time gives the block's size)."""
    cap = max_repeats if max_repeats is not None else max(10 * repeats, repeats)
    blocks = []
    for fn in fns:
        took = 0.0
        for _ in range(max(warmup, 1)):
            t0 = clock()
            fn()
            took = clock() - t0
        blocks.append(max(1, int(block_seconds / took) if took > 0 else cap))
    times: list[list[float]] = [[] for _ in fns]
    spent = [0.0 for _ in fns]

    def done(i: int) -> bool:
        return len(times[i]) >= cap or (len(times[i]) >= repeats and spent[i] >= min_seconds)

    while not all(done(i) for i in range(len(fns))):
        for i, fn in enumerate(fns):
            if done(i):
                continue
            between()
            fn()  # the switch-in run
            for _ in range(blocks[i]):
                t0 = clock()
                fn()
                dt = clock() - t0
                spent[i] += dt
                times[i].append(dt * 1e3)
                if done(i):
                    break
    return [Timing.of(t, s, warmup) for t, s in zip(times, spent)]
