"""Running one side of a case in a forked child: a crash or a hang stays in the child.

The worker that forks has imported numpy, onnx, onnxruntime and tilefuse, so a child
starts in milliseconds; the worker itself never creates an onnxruntime session or runs a
kernel (OpenMP's thread pool does not survive a fork), only its children do.

A child gets limits on address space (a hostile dim of 2**40 then fails to allocate
instead of taking the machine's memory), file size and core dumps, its own process group
(killed as a whole on timeout, with any compiler it started), its stdout and stderr in a
file, and a working directory of its own (``cwd``): a relative read there finds only what
the case put there.
"""
from __future__ import annotations

import os
import pickle
import resource
import select
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

from tests.robustness.cases import Outcome

MEMORY_LIMIT = 4 << 30
FILE_LIMIT = 1 << 30


class Stages:
    """Where a child is: written to a file before each stage, so that a crash or a hang
    can be placed (the file survives the child)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __call__(self, stage: str) -> None:
        with open(self.path, "w") as f:
            f.write(stage)

    def read(self) -> str:
        try:
            return self.path.read_text()
        except OSError:
            return ""


def run_forked(fn: Callable[[Stages], Outcome], work: Path, timeout: float, cwd: Path | None = None) -> Outcome:
    """``fn(stages)`` in a child; its Outcome, or a crash/timeout Outcome made here."""
    work.mkdir(parents=True, exist_ok=True)
    stages = Stages(work / "stage")
    log = work / "child.log"
    read_fd, write_fd = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_fd)
        _child(fn, stages, log, write_fd, cwd or work)
    os.close(write_fd)
    try:
        os.setpgid(pid, pid)
    except OSError:  # the child got there first, or already exited
        pass
    data, timed_out = _read_until(read_fd, start + timeout)
    os.close(read_fd)
    if timed_out:
        _kill_group(pid)
    _, status = os.waitpid(pid, 0)
    _kill_group(pid)  # anything the child left running (a compiler)
    seconds = time.monotonic() - start
    stderr = _tail(log)
    if timed_out:
        return Outcome("timeout", where=stages.read(), seconds=seconds, stderr=stderr)
    if data:
        try:
            outcome = pickle.loads(data)
            outcome.seconds, outcome.stderr = seconds, stderr
            return outcome
        except Exception as e:  # a torn result: the child died while writing it
            return Outcome("crash", message=f"unreadable result: {e}", where=stages.read(), seconds=seconds, stderr=stderr)
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else -os.WEXITSTATUS(status)
    return Outcome("crash", signal=sig, where=stages.read(), seconds=seconds, stderr=stderr,
                   message=_last_line(stderr))


def _child(fn: Callable[[Stages], Outcome], stages: Stages, log: Path, write_fd: int, cwd: Path) -> None:
    code = 0
    try:
        os.setpgid(0, 0)
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        cwd.mkdir(parents=True, exist_ok=True)
        os.chdir(cwd)
        try:
            outcome = fn(stages)
        except BaseException as e:  # the harness's own code failed: say so, do not crash
            outcome = Outcome("harness", error_type=type(e).__name__, message=str(e), traceback=traceback.format_exc())
        try:
            data = pickle.dumps(outcome)
        except Exception as e:
            data = pickle.dumps(Outcome("harness", error_type=type(e).__name__, message=f"result not picklable: {e}"))
        view = memoryview(data)
        while view:
            view = view[os.write(write_fd, view):]
    except BaseException:
        code = 70
        try:
            traceback.print_exc()
            sys.stderr.flush()
        except BaseException:
            pass
    finally:
        os._exit(code)


def _read_until(fd: int, deadline: float) -> tuple[bytes, bool]:
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return b"".join(chunks), True
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if ready:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks), False
            chunks.append(chunk)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", "replace")


def _last_line(text: str) -> str:
    lines = [s for s in text.splitlines() if s.strip()]
    return lines[-1] if lines else ""
