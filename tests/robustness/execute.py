"""The two sides of a case, as run inside a forked child (see isolate.py), and the CLI.

Each tilefuse side calls only tilefuse between ``stages`` markers and turns what
happened into an Outcome: a TilefuseError is "clean", any other exception "exception"
with the innermost tilefuse frame. Everything the harness prepares (files, feeds, entry
objects) is made before tilefuse is called, so a harness bug never counts against it.
"""
from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tests.robustness.cases import Outcome
from tests.robustness.isolate import MEMORY_LIMIT, Stages

REPO = Path(__file__).resolve().parents[2]
ORT_PROVIDERS = ["CPUExecutionProvider"]


def guarded(stages: Stages, body: Callable[[Stages], list[tuple[str, Any]]]) -> Outcome:
    """Run tilefuse calls; classify what they raise."""
    from tilefuse.errors import TilefuseError

    try:
        outputs = body(stages)
        # A session sits in reference cycles (its arena pool holds a bound method), so it
        # is freed only by the collector: collect now, as a process would by its exit, so
        # that memory a kernel corrupted is freed (and caught by malloc) in this child.
        stages("teardown")
        gc.collect()
    except TilefuseError as e:
        return Outcome("clean", error_type=type(e).__name__, message=str(e), where=stages.read())
    except BaseException as e:  # noqa: BLE001: anything else escaping tilefuse is a defect
        return Outcome("exception", error_type=type(e).__name__, message=str(e) or repr(e),
                       where=innermost_tilefuse_frame(e.__traceback__) or stages.read(),
                       traceback="".join(traceback.format_exception(e))[-6000:])
    return Outcome("ok", outputs=[(n, _plain(v)) for n, v in outputs])


def _plain(value: Any) -> Any:
    """Arrays travel back as they are; anything else by its repr (it is a wrong answer
    anyway, and may not pickle)."""
    return value if isinstance(value, np.ndarray) else f"<{type(value).__name__}>"


def innermost_tilefuse_frame(tb: Any) -> str:
    where = ""
    for frame in traceback.extract_tb(tb):
        path = Path(frame.filename)
        if "tilefuse" in path.parts and "tests" not in path.parts:
            rel = "/".join(path.parts[path.parts.index("tilefuse"):])
            where = f"{rel}:{frame.lineno} in {frame.name}"
    return where


# -- tilefuse through the API -----------------------------------------------------------
def api_model(entry: Any, shapes: Any, kwargs: dict[str, Any], feeds: dict[str, np.ndarray], out: Path,
              stages: Stages) -> Outcome:
    def body(st: Stages) -> list[tuple[str, Any]]:
        import tilefuse

        st("compile")
        plan = tilefuse.compile(entry, shapes=shapes, **kwargs) if shapes is not None else tilefuse.compile(entry, **kwargs)
        st("save")
        path = plan.save(out)
        st("load")
        sess = tilefuse.InferenceSession(path)
        names = [o.name for o in sess.get_outputs()]
        st("run")
        return list(zip(names, sess.run(None, feeds)))

    return guarded(stages, body)


def api_plan(path: Path, feeds: dict[str, np.ndarray], stages: Stages) -> Outcome:
    def body(st: Stages) -> list[tuple[str, Any]]:
        from tilefuse.runtime import InferenceSession

        st("load")
        sess = InferenceSession(path)
        names = [o.name for o in sess.get_outputs()]
        st("run")
        return list(zip(names, sess.run(None, feeds)))

    return guarded(stages, body)


def api_feeds(path: Path, make: Callable[[], tuple[Any, Any]], stages: Stages) -> Outcome:
    """``make()`` gives (output_names, feeds); made before tilefuse is called (a failure
    there escapes to isolate's harness handler). Outputs are labelled by position."""
    output_names, feeds = make()

    def body(st: Stages) -> list[tuple[str, Any]]:
        from tilefuse.runtime import InferenceSession

        st("load")
        sess = InferenceSession(path)
        st("run")
        result = sess.run(output_names, feeds)
        return [(f"#{i}", y) for i, y in enumerate(result)]

    return guarded(stages, body)


# -- onnxruntime, the reference, and the onnx checker -----------------------------------
def ort_session(model: str | bytes) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 4
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model, so, providers=ORT_PROVIDERS)


def ort_run(model: str | bytes, make: Callable[[], tuple[Any, Any]], positional: bool = False) -> Outcome:
    """onnxruntime on ``make()``'s (output_names, feeds); any exception it raises is its
    refusal ("clean")."""
    output_names, feeds = make()
    try:
        sess = ort_session(model)
        names = [o.name for o in sess.get_outputs()] if output_names is None else None
        result = sess.run(output_names, feeds)
    except Exception as e:  # noqa: BLE001: onnxruntime raises many types; all are refusals
        return Outcome("clean", error_type=type(e).__name__, message=str(e))
    labels = [f"#{i}" for i in range(len(result))] if positional or names is None else names
    return Outcome("ok", outputs=[(n, _plain(np.asarray(y) if not isinstance(y, np.ndarray) else y))
                                  for n, y in zip(labels, result)])


def reference_run(model: str | bytes, make: Callable[[], tuple[Any, Any]], positional: bool = False) -> Outcome:
    """onnx's own reference evaluator (numpy), the second opinion where tilefuse and
    onnxruntime disagree."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    output_names, feeds = make()
    try:
        proto = onnx.load(model) if isinstance(model, str) else onnx.load_from_string(model)
        sess = ReferenceEvaluator(proto)
        names = list(sess.output_names) if output_names is None else list(output_names)
        result = sess.run(names, feeds)
    except Exception as e:  # noqa: BLE001
        return Outcome("clean", error_type=type(e).__name__, message=str(e))
    labels = [f"#{i}" for i in range(len(result))] if positional or output_names is not None else names
    return Outcome("ok", outputs=[(n, _plain(np.asarray(y))) for n, y in zip(labels, result)])


def checker(model: str | bytes) -> Outcome:
    """The onnx checker with full (strict) shape inference: ok = valid, clean = invalid."""
    import onnx

    try:
        if isinstance(model, bytes):
            proto = onnx.ModelProto()
            proto.ParseFromString(model)
            onnx.checker.check_model(proto, full_check=True)
        else:
            onnx.checker.check_model(model, full_check=True)
    except Exception as e:  # noqa: BLE001: unparsable counts as invalid too
        return Outcome("clean", error_type=type(e).__name__, message=str(e))
    return Outcome("ok", outputs=[])


# -- tilefuse through the CLI -----------------------------------------------------------
CLI_TIMEOUT = 180.0
TRACEBACK = "Traceback (most recent call last)"
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def cli(args: list[str], cwd: Path, timeout: float = CLI_TIMEOUT) -> Outcome:
    """``python -m tilefuse ARGS`` in a subprocess, classified: exit 0 ok; exit 2 with exactly
    one stderr line ``tilefuse: error: ...`` and no traceback clean; else exception (a
    traceback), crash (a signal), timeout or unclean."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OPENBLAS_NUM_THREADS="1")
    cwd.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    command = [sys.executable, "-m", "tilefuse", *args]
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=_limits, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        out, err = proc.communicate()
        return Outcome("timeout", where=f"cli {args[0]}", seconds=time.monotonic() - start,
                       stderr=err.decode("utf-8", "replace")[-4000:])
    finally:
        _kill_group(proc.pid)  # whatever it left running (a compiler)
    return cli_outcome(args[0], proc.returncode, err.decode("utf-8", "replace"), out.decode("utf-8", "replace"),
                       time.monotonic() - start)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def cli_outcome(command: str, returncode: int, stderr: str, stdout: str = "", seconds: float = 0.0) -> Outcome:
    """What one CLI command did, from its exit status and stderr."""
    lines = [s for s in stderr.splitlines() if s.strip()]
    base = {"seconds": seconds, "stderr": stderr[-4000:], "extra": {"stdout": stdout[-2000:]}}
    where = f"cli {command}"
    if returncode < 0:
        return Outcome("crash", signal=-returncode, where=where, message=lines[-1] if lines else "", **base)
    if TRACEBACK in stderr:
        last = lines[-1] if lines else ""
        etype, _, msg = last.partition(": ")
        frames = [m for m in _FRAME.finditer(stderr) if "/tilefuse/" in m.group(1) and "/tests/" not in m.group(1)]
        if frames:
            f = frames[-1]
            where = f"tilefuse/{f.group(1).rsplit('/tilefuse/', 1)[1]}:{f.group(2)} in {f.group(3)}"
        return Outcome("exception", error_type=etype.strip(), message=msg, where=where, traceback=stderr[-6000:], **base)
    if returncode == 0:
        return Outcome("ok", **base)
    if returncode == 2 and len(lines) == 1 and lines[0].startswith("tilefuse: error: "):
        return Outcome("clean", error_type="exit 2", message=lines[0].removeprefix("tilefuse: error: "), where=where, **base)
    return Outcome("unclean", error_type=f"exit {returncode}", where=where,
                   message=f"`tilefuse {command}` exit {returncode} with {len(lines)} stderr line(s): " + " | ".join(lines[-3:]),
                   **base)


def _limits() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def write_inputs(feeds: dict[str, np.ndarray], folder: Path) -> list[str]:
    """``--input NAME=FILE`` arguments for ``feeds``, written as .npy files."""
    folder.mkdir(parents=True, exist_ok=True)
    args = []
    for i, (name, array) in enumerate(feeds.items()):
        path = folder / f"in{i}.npy"
        np.save(path, array, allow_pickle=False)
        args += ["--input", f"{name}={path}"]
    return args


def read_outputs(folder: Path, expected: list[str]) -> list[tuple[str, Any]]:
    """What ``tilefuse run --save`` wrote: the expected names first (in their order), then
    any other file under its own stem."""
    files = {p.name: p for p in folder.glob("*.npy")} if folder.is_dir() else {}
    out = []
    for name in expected:
        path = files.pop(f"{name.replace('/', '_')}.npy", None)
        if path is not None:
            out.append((name, np.load(path, allow_pickle=False)))
    out += [(p.stem, np.load(p, allow_pickle=False)) for _, p in sorted(files.items())]
    return out


def cli_model(model: Path, shapes: dict[str, Any] | None, feeds: dict[str, np.ndarray], work: Path,
              expected: Callable[[], list[str]], timeout: float = CLI_TIMEOUT) -> Outcome:
    """inspect (must not crash), optimize, then run with the feeds; ``expected()`` gives the
    output names to read back (asked only when the run succeeded)."""
    shape_args = [a for k, v in (shapes or {}).items() for a in ("--shape", f"{k}={_dims(v)}")]
    cwd = work / "cwd"
    inspect = cli(["inspect", str(model), *shape_args], cwd, timeout)
    if inspect.status not in ("ok", "clean"):
        return inspect
    plan = work / "cli.tfplan"
    optimize = cli(["optimize", str(model), *shape_args, "-o", str(plan)], cwd, timeout)
    if optimize.status != "ok":
        return optimize
    return cli_run(plan, feeds, work, expected, timeout)


def cli_run(plan: Path, feeds: dict[str, np.ndarray], work: Path, expected: Callable[[], list[str]],
            timeout: float = CLI_TIMEOUT) -> Outcome:
    out = work / "cli-out"
    run = cli(["run", str(plan), *write_inputs(feeds, work / "cli-in"), "--save", str(out)], work / "cwd", timeout)
    if run.status == "ok":
        run.outputs = read_outputs(out, expected())
    return run


def _dims(v: Any) -> str:
    return ",".join(str(d) for d in v) if isinstance(v, (tuple, list)) else str(v)
