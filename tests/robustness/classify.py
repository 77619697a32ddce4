"""From what tilefuse and onnxruntime did with a case to one verdict.

A pure function of the two outcomes, the case's expectation and (where onnxruntime
failed) the onnx checker's view, so that it can be tested on made-up outcomes. The rule
that matters most: "correct" only ever means that onnxruntime ran the same input and
tilefuse matched it.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from tests.robustness.cases import Expect, Outcome

# Max abs error allowed, relative to the reference's scale (max |finite value|, at least 1).
TOLERANCE = {"float64": 1e-7, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}


class Verdict(str, enum.Enum):
    CLEAN_ERROR = "clean error"
    CORRECT = "correct"
    UNVERIFIED = "unverified"  # ran; onnxruntime failed on a model the onnx checker finds valid
    DISPUTED = "disputed"  # differs from onnxruntime, matches onnx's reference evaluator
    CRASH = "crash"
    TRACEBACK = "traceback"
    WRONG = "wrong"  # silent wrong answer: differs, or ran although it must fail
    TIMEOUT = "timeout"
    REFUSED = "refused"  # a clean error where a result is required
    UNCLEAN = "unclean"  # the CLI failed without a traceback but not with one clean line
    HARNESS = "harness"  # the case itself is broken (its reference does not run)

    @property
    def failed(self) -> bool:
        return self not in (Verdict.CLEAN_ERROR, Verdict.CORRECT, Verdict.UNVERIFIED, Verdict.DISPUTED)


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    detail: str


def classify(expect: Expect, tf: Outcome, oracle: Outcome | None, spec_valid: bool | None = None,
             reference: Outcome | None = None) -> Judgement:
    """``oracle`` may be None where it is not needed (tilefuse failed, or ERROR);
    ``spec_valid`` is the onnx checker's verdict, asked only for SPEC cases that
    onnxruntime refused (None: not asked, or the checker itself broke); ``reference`` is
    onnx's reference evaluator on the same input, asked only where tilefuse ran and
    differs from onnxruntime (see ``needs_reference``)."""
    for side, o in (("tilefuse", tf), ("onnxruntime", oracle)):
        if o is not None and o.status == "harness":
            return Judgement(Verdict.HARNESS, f"the harness failed on the {side} side: {o.error_type}: {_line(o.message)}")
    if tf.status == "crash":
        return Judgement(Verdict.CRASH, f"{_signal_name(tf.signal)} in {tf.where or 'an unknown stage'}")
    if tf.status == "timeout":
        return Judgement(Verdict.TIMEOUT, f"no result after {tf.seconds:.0f} s in {tf.where or 'an unknown stage'}")
    if tf.status == "exception":
        return Judgement(Verdict.TRACEBACK, f"{tf.error_type}: {_line(tf.message)} (at {tf.where or '?'})")
    if tf.status == "unclean":
        return Judgement(Verdict.UNCLEAN, _line(tf.message))
    if tf.status == "clean":
        if expect is Expect.RESULT:
            if oracle is not None and oracle.status != "ok":
                return Judgement(Verdict.HARNESS, f"a RESULT case onnxruntime cannot run: {_line(oracle.message)}")
            return Judgement(Verdict.REFUSED, f"{tf.error_type}: {_line(tf.message)}")
        return Judgement(Verdict.CLEAN_ERROR, f"{tf.error_type}: {_line(tf.message)}")
    assert tf.status == "ok", tf.status
    if expect is Expect.ERROR:
        return Judgement(Verdict.WRONG, "ran although it must fail")
    if oracle is None:
        raise ValueError("tilefuse ran: the oracle's outcome is needed")
    if oracle.status == "ok":
        problem = compare_outputs(tf.outputs or [], oracle.outputs or [])
        if not problem:
            return Judgement(Verdict.CORRECT, "matches onnxruntime")
        # onnxruntime is not the spec: where it and onnx's reference evaluator disagree
        # (NaN through a reduction, say) and tilefuse sides with the reference, say so.
        if reference is not None and reference.status == "ok" and compare_outputs(oracle.outputs or [], reference.outputs or []) \
                and not compare_outputs(tf.outputs or [], reference.outputs or []):
            return Judgement(Verdict.DISPUTED, f"matches onnx's reference evaluator; onnxruntime differs: {problem}")
        return Judgement(Verdict.WRONG, problem)
    why = f"onnxruntime: {oracle.status} {_line(oracle.message)}".strip()
    if expect in (Expect.RESULT, Expect.EITHER):
        return Judgement(Verdict.HARNESS, f"the reference does not run ({why})")
    if oracle.status != "clean":  # onnxruntime crashed or hung: it said nothing about validity
        return Judgement(Verdict.UNVERIFIED, f"ran; {why}")
    if expect is Expect.ORT:
        return Judgement(Verdict.WRONG, f"ran although onnxruntime refuses it ({why})")
    if spec_valid is False:
        return Judgement(Verdict.WRONG, f"ran although onnxruntime and the onnx checker refuse it ({why})")
    return Judgement(Verdict.UNVERIFIED, f"ran; the onnx checker {'accepts' if spec_valid else 'could not judge'} it, {why}")


def needs_reference(expect: Expect, tf: Outcome, oracle: Outcome | None) -> bool:
    """True where the verdict hangs on a disagreement with onnxruntime's answer."""
    return (tf.status == "ok" and expect is not Expect.ERROR and oracle is not None and oracle.status == "ok"
            and bool(compare_outputs(tf.outputs or [], oracle.outputs or [])))


def compare_outputs(got: list[tuple[str, object]], want: list[tuple[str, object]]) -> str:
    """'' when ``got`` matches ``want`` (same names in order, then each array), else why not."""
    if [n for n, _ in got] != [n for n, _ in want]:
        return f"outputs {[n for n, _ in got]}, onnxruntime gives {[n for n, _ in want]}"
    for (name, g), (_, w) in zip(got, want):
        problem = compare_array(g, np.asarray(w))
        if problem:
            return f"output {name!r}: {problem}"
    return ""


def compare_array(got: object, want: np.ndarray) -> str:
    if not isinstance(got, np.ndarray):
        return f"returned {type(got).__name__}, not a numpy array"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}"
    if got.shape != want.shape:
        return f"shape {list(got.shape)}, expected {list(want.shape)}"
    if want.dtype.kind != "f" and str(want.dtype) != "bfloat16":
        bad = int(np.sum(got != want))
        return f"{bad} of {want.size} values differ" if bad else ""
    g, w = got.astype(np.float64), want.astype(np.float64)
    for what, mask in (("NaN", np.isnan), ("+inf", np.isposinf), ("-inf", np.isneginf)):
        differ = int(np.sum(mask(g) != mask(w)))
        if differ:
            return f"{what} in {differ} places that onnxruntime does not agree on"
    finite = np.isfinite(w)
    if not finite.any():
        return ""
    err = float(np.max(np.abs(g[finite] - w[finite])))
    scale = max(1.0, float(np.max(np.abs(w[finite]))))
    tol = TOLERANCE.get(str(want.dtype), 0.0)
    return f"max abs error {err:.3g} > {tol:g} x scale {scale:.3g}" if err > tol * scale else ""


def _line(text: str) -> str:
    lines = [s for s in text.strip().splitlines() if s.strip()]
    first = lines[0] if lines else ""
    return first[:300] + (" [...]" if len(lines) > 1 or len(first) > 300 else "")


def _signal_name(sig: int) -> str:
    import signal

    if sig <= 0:
        return f"exit status {-sig}" if sig else "death"
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"
