"""What a robustness case is: a hostile input, what must happen to it, and its feeds.

Cases are plain picklable records (they travel to worker processes). Everything random
about a case is fixed when it is generated, from the campaign seed, so the same seed
gives the same cases, and a case id names one case for ``campaign --only``.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class Expect(str, enum.Enum):
    """What tilefuse must do with a case.

    ERROR: fail with a clean error (the input is invalid or unsafe, whatever onnxruntime does).
    RESULT: run and match onnxruntime (a clean error is a refusal, a failure).
    EITHER: match onnxruntime or fail cleanly; onnxruntime must run it.
    ORT: onnxruntime decides: where it runs, EITHER; where it fails, ERROR.
    SPEC: like ORT, but where onnxruntime fails the model also goes through the onnx
        checker (full check): invalid there too, ERROR; valid, nothing to compare with.
    """

    ERROR = "error"
    RESULT = "result"
    EITHER = "either"
    ORT = "ort"
    SPEC = "spec"


@dataclass(frozen=True)
class TensorSpec:
    """A feed: floats are standard normal (never zeros); integers uniform in [low, high)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    low: int = 0
    high: int = 2


def make_feeds(specs: tuple[TensorSpec, ...], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for s in specs:
        dt = np.dtype(s.dtype)
        if dt.kind == "f":
            feeds[s.name] = rng.standard_normal(s.shape).astype(dt)
        elif dt.kind in "iu":
            feeds[s.name] = rng.integers(s.low, s.high, s.shape).astype(dt)
        elif dt.kind == "b":
            feeds[s.name] = rng.integers(0, 2, s.shape).astype(bool)
        else:
            raise ValueError(f"no feed generator for dtype {s.dtype}")
    return feeds


@dataclass(frozen=True)
class Case:
    """Common to every case. ``note`` is the one-line repro shown in failure reports."""

    id: str
    family: str
    expect: Expect
    note: str
    cli: bool = False  # through ``python -m tilefuse`` in a subprocess instead of the API
    timeout: float = 0.0  # seconds for the tilefuse side; 0: the worker's default

    @property
    def kind(self) -> str:
        return type(self).__name__.removesuffix("Case").lower()


@dataclass(frozen=True)
class ModelCase(Case):
    """A model in files under the case's folder, compiled and run on ``inputs``.

    ``files`` are (path relative to the case folder, bytes); ``links`` are (path, target)
    symlinks whose target may start with ``{work}/`` (the case folder); ``fifos`` are named
    pipes. ``entry`` says what ``tilefuse.compile`` gets: "path" (``model``, a str),
    "pathlib", "bytes", "bytearray", "proto" (loaded with its external data),
    "proto_unloaded" (loaded without), "dir" (the model's folder) or "value" (``value``
    itself). ``oracle_model``, when given, is the model onnxruntime runs instead (a
    hostile argument for the same good model). ``compile_kwargs`` go to compile as they are.
    """

    files: tuple[tuple[str, bytes], ...] = ()
    links: tuple[tuple[str, str], ...] = ()
    fifos: tuple[str, ...] = ()
    model: str = "model/model.onnx"
    entry: str = "path"
    value: Any = None
    shapes: Any = None
    compile_kwargs: tuple[tuple[str, Any], ...] = ()
    inputs: tuple[TensorSpec, ...] = ()
    feed_seed: int = 0
    oracle_model: bytes | None = None
    template: bool = False  # replace "{work}" in the .onnx files' external-data locations


@dataclass(frozen=True)
class PlanCase(Case):
    """A copy of the compiled base plan, corrupted by ``mutation`` (a name in
    plan_mutations.MUTATIONS with ``params``), loaded and run on good feeds."""

    base: str = "lm"
    mutation: str = ""
    params: tuple[tuple[str, Any], ...] = ()
    feed_seed: int = 0


@dataclass(frozen=True)
class FeedCase(Case):
    """The compiled base plan run on hostile feeds built by ``recipe`` (a name in
    gen_feeds.RECIPES with ``params``) from good ones."""

    base: str = "lm"
    recipe: str = ""
    params: tuple[tuple[str, Any], ...] = ()
    feed_seed: int = 0


@dataclass(frozen=True)
class ProbeCase(Case):
    """The harness checking itself: the tilefuse side does ``action`` (segv, abort, sleep,
    raise, clean, exit, ok, nan) instead of calling tilefuse; the oracle returns ``ones``."""

    action: str = "ok"
    oracle: str = "ok"  # ok | fail


@dataclass
class Outcome:
    """What one side (tilefuse or onnxruntime) did with a case.

    status: ok (outputs), clean (a TilefuseError, or CLI exit 2 with one line), exception
    (any other exception, or a CLI traceback), unclean (CLI failing without a traceback
    but not cleanly), crash (a signal, or an exit without a result), timeout, harness (the
    harness's own code failed: a broken case, never tilefuse's fault or credit).
    """

    status: str
    error_type: str = ""
    message: str = ""
    where: str = ""  # innermost tilefuse frame of an exception, or the stage that crashed
    traceback: str = ""
    outputs: list[tuple[str, Any]] | None = None
    signal: int = 0
    stderr: str = ""
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
