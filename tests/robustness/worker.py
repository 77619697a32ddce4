"""A worker process: runs cases one after another, each side in a forked child.

Started by pool.py as ``python -m tests.robustness.worker``; reads pickled cases from
stdin and writes pickled result records to stdout (length-prefixed), until stdin closes.
It compiles each base plan once (in a child) and keeps onnxruntime's results on the base
models, so that the many plan and feed cases cost a plan load and a run each.
"""
from __future__ import annotations

import dataclasses
import os
import pickle
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np

from tests.robustness import execute
from tests.robustness.bases import INPUTS, base_bytes
from tests.robustness.cases import Case, Expect, FeedCase, ModelCase, Outcome, PlanCase, ProbeCase, make_feeds
from tests.robustness.classify import Judgement, Verdict, classify, needs_reference
from tests.robustness.isolate import Stages, run_forked

API_TIMEOUT = 120.0  # a compile included
RUN_TIMEOUT = 45.0  # a plan load and a run
ORT_TIMEOUT = 60.0
CHECK_TIMEOUT = 30.0
BASE_TIMEOUT = 600.0


# What a case's sides did: tilefuse, onnxruntime (None: not needed), the onnx checker's
# verdict (None: not asked), and how to ask onnx's reference evaluator (None: no such thing).
Sides = tuple[Outcome, "Outcome | None", "bool | None", "Callable[[], Outcome] | None"]


class HarnessError(Exception):
    """The harness could not prepare a case (its own defect, never tilefuse's)."""


class Worker:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._plans: dict[str, Path | Outcome] = {}
        self._oracles: dict[tuple[str, int], Outcome] = {}

    # -- one case ---------------------------------------------------------------------
    def handle(self, case: Case) -> dict[str, Any]:
        work = Path(tempfile.mkdtemp(prefix="case-", dir=self.root))
        start = time.monotonic()
        tf: Outcome | None = None
        try:
            tf, oracle, spec, reference = self._dispatch(case, work)
            judgement = classify(case.expect, tf, oracle, spec)
            if reference is not None and needs_reference(case.expect, tf, oracle):
                judgement = classify(case.expect, tf, oracle, spec, reference())
        except Exception as e:  # noqa: BLE001: a harness defect is reported, never fatal
            judgement = Judgement(Verdict.HARNESS, f"{type(e).__name__}: {e}")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        record = {
            "id": case.id, "family": case.family, "kind": case.kind, "expect": case.expect.value, "cli": case.cli,
            "note": case.note, "verdict": judgement.verdict.value, "detail": judgement.detail,
            "seconds": round(time.monotonic() - start, 3),
        }
        if tf is not None:
            record.update(error_type=tf.error_type, where=tf.where)
            if judgement.verdict.failed:
                record.update(stderr=tf.stderr[-2000:], traceback=tf.traceback[-4000:])
        return record

    def _dispatch(self, case: Case, work: Path) -> Sides:
        if isinstance(case, ModelCase):
            return self._model(case, work)
        if isinstance(case, PlanCase):
            return self._plan(case, work)
        if isinstance(case, FeedCase):
            return self._feeds(case, work)
        if isinstance(case, ProbeCase):
            return self._probe(case, work)
        raise HarnessError(f"unknown case type {type(case).__name__}")

    def _model(self, case: ModelCase, work: Path) -> Sides:
        folder = work / "tf"
        materialize(case, folder)
        feeds = make_feeds(case.inputs, case.feed_seed)
        oracle: Outcome | None = None

        def onnxruntime_side() -> Outcome:
            nonlocal oracle
            if oracle is None:
                ort_folder = work / "ort"
                materialize(case, ort_folder)
                model: str | bytes = case.oracle_model if case.oracle_model is not None else str(ort_folder / case.model)
                oracle = run_forked(lambda st: execute.ort_run(model, lambda: (None, feeds)), work / "ort-run",
                                    ORT_TIMEOUT, cwd=ort_folder / "cwd")
            return oracle

        if case.cli:
            if case.entry != "path":
                raise HarnessError("a CLI case takes its model by path")
            tf = execute.cli_model(folder / case.model, case.shapes, feeds, work,
                                   lambda: [n for n, _ in (onnxruntime_side().outputs or [])], case.timeout or execute.CLI_TIMEOUT)
        else:
            entry = prepare_entry(case, folder)
            kwargs = dict(case.compile_kwargs)
            tf = run_forked(lambda st: execute.api_model(entry, case.shapes, kwargs, feeds, work / "out.tfplan", st),
                            work / "tf-run", case.timeout or API_TIMEOUT, cwd=folder / "cwd")
        if case.expect is not Expect.ERROR and (tf.status == "ok" or case.expect is Expect.RESULT):
            onnxruntime_side()
        spec = None
        if tf.status == "ok" and case.expect is Expect.SPEC and oracle is not None and oracle.status == "clean":
            model = case.oracle_model if case.oracle_model is not None else str(work / "ort" / case.model)
            verdict = run_forked(lambda st: execute.checker(model), work / "check", CHECK_TIMEOUT, cwd=work / "ort" / "cwd")
            spec = {"ok": True, "clean": False}.get(verdict.status)

        def second_opinion() -> Outcome:
            model = case.oracle_model if case.oracle_model is not None else str(work / "ort" / case.model)
            return run_forked(lambda st: execute.reference_run(model, lambda: (None, feeds)), work / "ref-run",
                              ORT_TIMEOUT, cwd=work / "ort" / "cwd")

        return tf, oracle, spec, second_opinion

    def _plan(self, case: PlanCase, work: Path) -> Sides:
        from tests.robustness.gen_plans import mutate

        base = self.base_plan(case.base)
        plan = work / "plan.tfplan"
        shutil.copytree(base, plan, symlinks=True)
        mutate(plan, case.mutation, dict(case.params), work / "outside", self.base_plan)
        feeds = make_feeds(INPUTS[case.base], case.feed_seed)
        if case.cli:
            tf = execute.cli_run(plan, feeds, work, lambda: [n for n, _ in (self.base_oracle(case.base, case.feed_seed).outputs or [])],
                                 case.timeout or execute.CLI_TIMEOUT)
        else:
            tf = run_forked(lambda st: execute.api_plan(plan, feeds, st), work / "tf-run", case.timeout or RUN_TIMEOUT,
                            cwd=work / "cwd")
        oracle = self.base_oracle(case.base, case.feed_seed) if tf.status == "ok" and case.expect is not Expect.ERROR else None

        def second_opinion() -> Outcome:
            model = base_bytes(case.base)
            return run_forked(lambda st: execute.reference_run(model, lambda: (None, feeds), positional=True),
                              work / "ref-run", ORT_TIMEOUT, cwd=work / "cwd")

        # By position: a renamed output is an interface change the caller sees, not a wrong value.
        return positional(tf), positional(oracle) if oracle is not None else None, None, second_opinion

    def _feeds(self, case: FeedCase, work: Path) -> Sides:
        from tests.robustness.gen_feeds import RECIPES

        base = self.base_plan(case.base)
        recipe = RECIPES[case.recipe]
        params = dict(case.params)
        good = make_feeds(INPUTS[case.base], case.feed_seed)

        def hostile() -> tuple[Any, Any]:
            made = recipe(dict(good), **params)
            return made.output_names, made.feeds

        def canonical() -> tuple[Any, Any]:
            made = recipe(dict(good), **params)
            return made.oracle_names, made.oracle_feeds

        if case.cli:
            names, feeds = hostile()
            if names is not None or not all(isinstance(v, np.ndarray) and v.dtype != object for v in feeds.values()):
                raise HarnessError(f"recipe {case.recipe} cannot go through the CLI")
            # read back in the base's output order, then labelled by position like the API's
            tf = positional(execute.cli_run(base, feeds, work,
                                            lambda: [n for n, _ in (self.base_oracle(case.base, case.feed_seed).outputs or [])],
                                            case.timeout or execute.CLI_TIMEOUT))
        else:
            tf = run_forked(lambda st: execute.api_feeds(base, hostile, st), work / "tf-run", case.timeout or RUN_TIMEOUT,
                            cwd=work / "cwd")
        oracle = None
        if case.expect is not Expect.ERROR and (tf.status == "ok" or case.expect is Expect.RESULT):
            model = base_bytes(case.base)
            oracle = run_forked(lambda st: execute.ort_run(model, canonical, positional=True), work / "ort-run",
                                ORT_TIMEOUT, cwd=work / "cwd")

        def second_opinion() -> Outcome:
            model = base_bytes(case.base)
            return run_forked(lambda st: execute.reference_run(model, canonical, positional=True), work / "ref-run",
                              ORT_TIMEOUT, cwd=work / "cwd")

        return tf, oracle, None, second_opinion

    def _probe(self, case: ProbeCase, work: Path) -> Sides:
        tf = run_forked(lambda st: probe(case.action, st), work / "tf-run", case.timeout or API_TIMEOUT)

        def ref(st: Stages) -> Outcome:
            if case.oracle == "fail":
                return Outcome("clean", error_type="Fail", message="the oracle refuses")
            return Outcome("ok", outputs=[("y", np.ones(3, np.float32))])

        oracle = run_forked(ref, work / "ort-run", ORT_TIMEOUT)
        return tf, oracle, None, None

    # -- shared per worker ------------------------------------------------------------------
    def base_plan(self, name: str) -> Path:
        if name not in self._plans:
            out = self.root / "bases" / f"{name}.tfplan"
            model = base_bytes(name)

            def build(st: Stages) -> Outcome:
                def body(st: Stages) -> list:
                    import tilefuse

                    st("compile base")
                    tilefuse.compile(model).save(out)
                    return []

                return execute.guarded(st, body)

            done = run_forked(build, self.root / "bases" / f"{name}-build", BASE_TIMEOUT)
            self._plans[name] = out if done.status == "ok" else done
        got = self._plans[name]
        if isinstance(got, Outcome):
            raise HarnessError(f"base plan {name!r} does not build: {got.status} {got.error_type}: {got.message[:300]}")
        return got

    def base_oracle(self, name: str, seed: int) -> Outcome:
        key = (name, seed)
        if key not in self._oracles:
            model, feeds = base_bytes(name), make_feeds(INPUTS[name], seed)
            self._oracles[key] = run_forked(lambda st: execute.ort_run(model, lambda: (None, feeds)),
                                            self.root / f"oracle-{name}-{seed}", ORT_TIMEOUT)
            if self._oracles[key].status != "ok":
                raise HarnessError(f"onnxruntime does not run base {name!r}: {self._oracles[key].message[:300]}")
        return self._oracles[key]


def positional(o: Outcome) -> Outcome:
    """A copy of ``o`` with its outputs labelled #0, #1, ..."""
    if o.outputs is None:
        return o
    return dataclasses.replace(o, outputs=[(f"#{i}", y) for i, (_, y) in enumerate(o.outputs)])


def materialize(case: ModelCase, folder: Path) -> None:
    """Write the case's files, symlinks and named pipes under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cwd").mkdir(exist_ok=True)
    for rel, data in case.files:
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    for rel, target in case.links:
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target.replace("{work}", str(folder)), path)
    for rel in case.fifos:
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path)
    if case.template:
        from tests.robustness.gen_external import fill_locations

        for rel, _ in case.files:
            if rel.endswith(".onnx"):
                fill_locations(folder / rel, str(folder))


def prepare_entry(case: ModelCase, folder: Path) -> Any:
    """What ``tilefuse.compile`` is given, made here so that a failure is the harness's."""
    import onnx

    path = folder / case.model
    try:
        return {
            "path": lambda: str(path),
            "pathlib": lambda: path,
            "bytes": lambda: path.read_bytes(),
            "bytearray": lambda: bytearray(path.read_bytes()),
            "proto": lambda: onnx.load(str(path)),
            "proto_unloaded": lambda: onnx.load(str(path), load_external_data=False),
            "dir": lambda: str(path.parent),
            "value": lambda: case.value,
        }[case.entry]()
    except KeyError:
        raise HarnessError(f"unknown entry {case.entry!r}") from None
    except Exception as e:  # noqa: BLE001
        raise HarnessError(f"cannot prepare entry {case.entry!r}: {type(e).__name__}: {e}") from None


def probe(action: str, stages: Stages) -> Outcome:
    """The harness's self-test actions, run where tilefuse would be."""
    import ctypes
    import signal

    from tilefuse.errors import InputError

    def body(st: Stages) -> list:
        st(f"probe {action}")
        if action == "segv":
            ctypes.string_at(0)
        elif action == "abort":
            os.abort()
        elif action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif action == "kill-worker":  # the worker itself dies: the pool must start another
            os.kill(os.getppid(), signal.SIGKILL)
            os._exit(0)
        elif action == "sleep":
            time.sleep(3600)
        elif action == "exit":
            os._exit(3)
        elif action == "raise":
            raise KeyError("boom")
        elif action == "clean":
            raise InputError("a clean error")
        elif action == "alloc":
            np.ones(1 << 40, np.uint8)
        elif action == "heap":  # corrupt the heap, answer, and leave the damage to teardown
            _HeapDamage()
        elif action == "nan":
            return [("y", np.array([1, 1, np.nan], np.float32))]
        elif action == "wrongname":
            return [("z", np.ones(3, np.float32))]
        return [("y", np.ones(3, np.float32))]

    return execute.guarded(stages, body)


class _HeapDamage:
    """Owns a malloc'ed block whose size field it overwrote; freed (and caught by glibc)
    only when the collector breaks its reference cycle, as a session's memory is."""

    def __init__(self) -> None:
        import ctypes

        self.libc = ctypes.CDLL(None)
        self.libc.malloc.restype = ctypes.c_void_p
        self.libc.free.argtypes = [ctypes.c_void_p]
        self.block = self.libc.malloc(24)
        ctypes.memset(self.block - 8, 0xFF, 8)
        self.cycle = self

    def __del__(self) -> None:
        self.libc.free(self.block)


# -- the process --------------------------------------------------------------------------
def send(stream: BinaryIO, obj: object) -> None:
    data = pickle.dumps(obj)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def receive(stream: BinaryIO) -> object | None:
    head = stream.read(8)
    if len(head) < 8:
        return None
    (size,) = struct.unpack("<Q", head)
    data = stream.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)


def main() -> int:
    # The protocol owns the real stdout; anything else printed goes to stderr.
    channel = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.path[:] = [os.path.abspath(p) for p in sys.path]  # children chdir
    # Imported once here, shared by every child. Not onnxruntime: importing it starts a
    # thread, and a fork taken while another thread holds a lock can hang the child in
    # its exit handlers; children import it themselves (in 0.1 s). The worker stays
    # single-threaded (OPENBLAS_NUM_THREADS=1 from the pool).
    import onnx  # noqa: F401

    import tilefuse.cli.main  # noqa: F401
    import tilefuse.compiler  # noqa: F401
    import tilefuse.runtime  # noqa: F401

    threads = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1
    if threads != 1:
        print(f"robustness worker: {threads} threads before forking; children may hang", file=sys.stderr)
    # The pool gives the scratch folder (and removes it, even after a crash); alone, make one.
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="tilefuse-robust-"))
    worker = Worker(root)
    try:
        while (case := receive(sys.stdin.buffer)) is not None:
            send(channel, worker.handle(case))  # type: ignore[arg-type]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
