"""Running cases on a few worker processes (worker.py), re-spawning one that dies.

A worker forks a child for each side of each case, so it should never die; if it does
anyway (or stops answering), the case it held is recorded as a crash or timeout of the
harness's own making ("worker ..."), the worker is started again, and the rest go on.
"""
from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from tests.robustness.cases import Case
from tests.robustness.worker import receive, send

REPO = Path(__file__).resolve().parents[2]
# Above the worker's own per-side limits (a case runs up to three sides and a CLI case
# up to three commands), so that a live worker always answers first.
CASE_DEADLINE = 900.0


class WorkerProcess:
    def __init__(self, log: Path | None) -> None:
        self.log = log
        self.proc: subprocess.Popen | None = None
        self.root: Path | None = None

    def start(self) -> None:
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONPATH=str(REPO))
        err = open(self.log, "ab") if self.log else None  # None: the worker shares our stderr
        # The worker's scratch folder is made (and removed) here: a worker that dies cannot.
        self.root = Path(tempfile.mkdtemp(prefix="tilefuse-robust-"))
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.robustness.worker", str(self.root)], cwd=REPO,
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
        if self.log:
            err.close()  # type: ignore[union-attr]

    def run(self, case: Case) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        assert self.proc is not None and self.proc.stdin and self.proc.stdout
        start = time.monotonic()
        try:
            send(self.proc.stdin, case)
            ready, _, _ = select.select([self.proc.stdout], [], [], CASE_DEADLINE)
            result = receive(self.proc.stdout) if ready else None
        except (BrokenPipeError, OSError, EOFError):
            result = None
        if isinstance(result, dict):
            return result
        timed_out = time.monotonic() - start >= CASE_DEADLINE
        self.stop()
        verdict = "timeout" if timed_out else "crash"
        return {"id": case.id, "family": case.family, "kind": case.kind, "expect": case.expect.value, "cli": case.cli,
                "note": case.note, "verdict": verdict, "detail": f"the worker process {'hung' if timed_out else 'died'}",
                "where": "worker", "error_type": "", "seconds": round(time.monotonic() - start, 3)}

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None


def run_cases(cases: Sequence[Case], workers: int = 2, log: Path | None = None,
              progress: Callable[[int, dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Every case's result record, in the order of ``cases``."""
    results: list[dict[str, Any] | None] = [None] * len(cases)
    lock = threading.Lock()
    next_index = [0]
    done = [0]

    def loop() -> None:
        worker = WorkerProcess(log)
        try:
            while True:
                with lock:
                    i = next_index[0]
                    if i >= len(cases):
                        return
                    next_index[0] += 1
                record = worker.run(cases[i])
                with lock:
                    results[i] = record
                    done[0] += 1
                    if progress:
                        progress(done[0], record)
        finally:
            worker.stop()

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(max(1, min(workers, len(cases))))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for r in results if r is not None]
