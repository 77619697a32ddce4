"""``tilefuse.bench.measure_interleaved``: runtimes timed in turn, in blocks, so that a
machine whose speed drifts moves them alike (``tilefuse bench --against``,
benchmarks/cpu_vs_onnxruntime.py). A fake clock makes every duration exact."""
from __future__ import annotations

from tilefuse.bench import measure_interleaved


class _Machine:
    """A clock, and runtimes whose runs advance it by their cost times the machine's
    slowness at that moment (``slowness(now)``); each run is logged by name."""

    def __init__(self, slowness=lambda now: 1.0) -> None:
        self.now, self.slowness, self.log = 0.0, slowness, []

    def clock(self) -> float:
        return self.now

    def pause(self) -> None:
        """What the benchmark does between blocks (waiting for spinners): logged."""
        self.log.append("|")
        self.now += 0.01

    def runtime(self, name: str, cost: float):
        def run() -> None:
            self.log.append(name)
            self.now += cost * self.slowness(self.now)
        return run


def test_a_drifting_machine_moves_both_alike():
    # the machine slows steadily to 3x over the benchmark: one after the other, the second
    # runtime would look about twice as slow as it is; in turn, the ratio stays true
    ramp = _Machine(lambda now: 1.0 + now / 5.0)
    fast, slow = ramp.runtime("a", 0.002), ramp.runtime("b", 0.003)
    a, b = measure_interleaved([fast, slow], repeats=20, min_seconds=2.0, max_repeats=10**6, clock=ramp.clock, between=ramp.pause)
    assert abs(b.median_ms / a.median_ms - 1.5) < 0.1
    # the contrast: the same machine, one runtime timed after the other
    seq = _Machine(lambda now: 1.0 + now / 5.0)
    first = measure_interleaved([seq.runtime("a", 0.002)], repeats=20, min_seconds=2.0, max_repeats=10**6,
                                clock=seq.clock, between=seq.pause)[0]
    second = measure_interleaved([seq.runtime("b", 0.003)], repeats=20, min_seconds=2.0, max_repeats=10**6,
                                 clock=seq.clock, between=seq.pause)[0]
    assert second.median_ms / first.median_ms > 2.0  # what timing one after the other reports


def test_blocks_alternate_and_each_block_starts_with_an_untimed_run():
    m = _Machine()
    a, b = measure_interleaved([m.runtime("a", 0.01), m.runtime("b", 0.02)], warmup=2, repeats=5, min_seconds=0.5,
                               block_seconds=0.1, clock=m.clock, between=m.pause)
    assert m.log[:4] == ["a", "a", "b", "b"]  # warm-up
    blocks = [[b[0], len(b)] for b in "".join(m.log[4:]).split("|")[1:]]  # a pause before each block
    assert all(len(set(b)) == 1 for b in "".join(m.log[4:]).split("|")[1:])
    assert [n for n, _ in blocks] == ["a", "b"] * (len(blocks) // 2)
    # a's blocks: one untimed run and 10 timed (0.1 s of 0.01 s runs); b's: one and 5
    assert all(k == 11 for n, k in blocks if n == "a") and all(k == 6 for n, k in blocks if n == "b")
    assert a.repeats == sum(k - 1 for n, k in blocks if n == "a") and b.repeats == sum(k - 1 for n, k in blocks if n == "b")
    assert abs(a.seconds - 0.01 * a.repeats) < 1e-9 and a.seconds >= 0.5 and b.seconds >= 0.5
    assert abs(a.median_ms - 10.0) < 1e-9 and abs(b.median_ms - 20.0) < 1e-9 and a.warmup == 2


def test_exactly_the_runs_asked_when_no_duration_is_asked():
    m = _Machine()
    a, b = measure_interleaved([m.runtime("a", 0.0001), m.runtime("b", 0.0003)], warmup=0, repeats=30,
                               min_seconds=0, clock=m.clock, between=m.pause)
    assert a.repeats == 30 and b.repeats == 30 and a.warmup == 0
    capped = measure_interleaved([m.runtime("c", 0.0001)], repeats=5, min_seconds=100, max_repeats=40, clock=m.clock, between=m.pause)
    assert capped[0].repeats == 40
