"""Compile feedback: what a compile is doing, by stage and by kernel.

``compile_model(..., progress=p)`` calls ``p.begin(stage, total)``, then ``p.step(stage,
cached)`` once per unit (a group lowered, a kernel built: ``cached`` when the kernel came
from the build cache), then ``p.end(stage)``; stages are "import", "partition", "lower",
"build" and "link". ``Lines`` prints one plain line per stage when it ends (for logs and
pipes); ``Bars`` also draws a tqdm bar per stage on stderr while it runs (for a terminal).
The lines go to stdout, with the command's other output: stderr holds errors only, one
line each. Both may be stepped from the build's worker threads.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:  # imported when a bar is shown
    from tqdm import tqdm


class Progress:
    """Reports nothing; the interface."""

    def begin(self, stage: str, total: int = 0) -> None:
        pass

    def step(self, stage: str, cached: bool = False) -> None:
        pass

    def end(self, stage: str) -> None:
        pass


class _Counted(Progress):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._start: dict[str, float] = {}
        self._done: dict[str, int] = {}
        self._cached: dict[str, int] = {}
        self._total: dict[str, int] = {}

    def begin(self, stage: str, total: int = 0) -> None:
        with self._lock:
            self._start[stage], self._done[stage], self._cached[stage], self._total[stage] = time.perf_counter(), 0, 0, total

    def step(self, stage: str, cached: bool = False) -> None:
        with self._lock:
            self._done[stage] = self._done.get(stage, 0) + 1
            self._cached[stage] = self._cached.get(stage, 0) + int(cached)

    def line(self, stage: str) -> str:
        seconds = time.perf_counter() - self._start.get(stage, time.perf_counter())
        done, cached = self._done.get(stage, 0), self._cached.get(stage, 0)
        what = {"lower": f"{done} group(s) lowered",
                "build": f"{done} kernel(s): {cached} from the cache, {done - cached} compiled"}.get(stage, "")
        return f"{stage} {seconds:.2f} s" + (f": {what}" if what else "")


class Lines(_Counted):
    """One line per finished stage: ``tilefuse: build 4.12 s: 13 kernel(s): 11 from the cache, 2 compiled``."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        super().__init__()
        self.stream = stream if stream is not None else sys.stdout

    def end(self, stage: str) -> None:
        print(f"tilefuse: {self.line(stage)}", file=self.stream, flush=True)


class Bars(_Counted):
    """A tqdm bar per stage with units (lower, build), on stderr; the stage's line on stdout when it ends."""

    def __init__(self) -> None:
        super().__init__()
        self._bars: dict[str, tqdm] = {}

    def begin(self, stage: str, total: int = 0) -> None:
        super().begin(stage, total)
        if total:
            from tqdm import tqdm

            self._bars[stage] = tqdm(total=total, desc=stage, unit="kernel" if stage == "build" else "group",
                                     leave=False, file=sys.stderr)

    def step(self, stage: str, cached: bool = False) -> None:
        super().step(stage, cached)
        bar = self._bars.get(stage)
        if bar is not None:
            bar.update(1)

    def end(self, stage: str) -> None:
        bar = self._bars.pop(stage, None)
        if bar is not None:
            bar.close()
        print(f"tilefuse: {self.line(stage)}", file=sys.stdout, flush=True)


def for_terminal() -> Progress:
    """Bars on a terminal, plain lines otherwise."""
    return Bars() if sys.stderr.isatty() else Lines()
