"""Indices read at run time, through the whole CPU pipeline (tile_ir/lower/checks.py).

A valid index (in [-n, n), negative ones counting from the end) gives onnxruntime's
answer; one outside that range fails the run with an ExecutionError naming the graph
input, the ONNX node and the value, and never reads or writes memory out of bounds.
Out-of-range runs happen in a child process: before the checks, a BERT plan fed
``input_ids`` of 2**40 segfaulted, which would take pytest down with it.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

import tilefuse
from tilefuse.compare import compare_output
from tilefuse.compiler import compile_model
from tests.compiler.index_cases import (BAD_IDS, BERT_SHAPES, CASES, EXAMPLE, F, I64, REPO, bert_feeds, bert_message,
                                        model, one_hot_feeds, one_hot_model)
from tilefuse.errors import ConversionError, ExecutionError

# A child that runs a plan on saved feeds and prints what happened as one JSON line.
CHILD = r"""
import json, sys
import numpy as np
import tilefuse
from tilefuse.errors import ExecutionError
sess = tilefuse.InferenceSession(sys.argv[1])
feeds = dict(np.load(sys.argv[2]))
result = {}
try:
    sess.run(None, feeds)
    result["error"] = None
except ExecutionError as e:
    result["error"] = str(e)
# the session stays usable: the same feeds with the bad index replaced
valid = dict(np.load(sys.argv[3]))
result["after"] = [o.tolist() for o in sess.run(None, valid)]
print(json.dumps(result))
"""


def _child(plan: Path, feeds: dict, valid: dict, tmp: Path) -> dict:
    np.savez(tmp / "bad.npz", **feeds)
    np.savez(tmp / "valid.npz", **valid)
    done = subprocess.run([sys.executable, "-c", CHILD, str(plan), str(tmp / "bad.npz"), str(tmp / "valid.npz")],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == 0, f"the child died (rc {done.returncode}): {done.stderr[-2000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def _onnxruntime(model: bytes | Path, feeds: dict) -> list[np.ndarray]:
    sess = ort.InferenceSession(model if isinstance(model, bytes) else str(model), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _matches(got, want) -> None:
    for g, w in zip(got, want, strict=True):
        c = compare_output("out", np.asarray(g, dtype=w.dtype), w)
        assert c.ok, c.problem


# ------------------------------------------------------------------ BERT's input_ids

@pytest.fixture(scope="module")
def bert_plan(tmp_path_factory) -> Path:
    return compile_model(EXAMPLE, "cpu", BERT_SHAPES).plan.save(tmp_path_factory.mktemp("bert") / "b.tfplan")


@pytest.mark.parametrize("bad", BAD_IDS)
def test_out_of_range_input_ids_fail_the_run_and_name_the_input(bad, bert_plan, tmp_path):
    rng = np.random.default_rng()
    valid = bert_feeds(rng)
    feeds = {k: v.copy() for k, v in valid.items()}
    feeds["input_ids"][rng.integers(2), rng.integers(16)] = bad
    result = _child(bert_plan, feeds, valid, tmp_path)
    assert result["error"] == bert_message(bad)
    _matches(result["after"], _onnxruntime(EXAMPLE, valid))


def test_negative_input_ids_count_from_the_end_as_in_onnxruntime(bert_plan):
    rng = np.random.default_rng()
    feeds = bert_feeds(rng, low=-100)
    feeds["input_ids"][0, :2] = [-100, -1]
    _matches(tilefuse.InferenceSession(bert_plan).run(None, feeds), _onnxruntime(EXAMPLE, feeds))


# ------------------------------------------------------------------ one op at a time



@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.parametrize("kind", ["valid", "negative"])
def test_valid_indices_match_onnxruntime(case, kind):
    feeds, _ = case.feeds(np.random.default_rng(), kind)
    plan = compile_model(case.model, "cpu").plan
    assert any(step.sites for step in plan.steps), "the op's indices are checked in its kernel"
    _matches(tilefuse.InferenceSession(plan).run(None, feeds), _onnxruntime(case.model, feeds))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_an_index_out_of_range_fails_like_onnxruntime_and_names_it(case, tmp_path):
    rng = np.random.default_rng()
    feeds, bad = case.feeds(rng, "bad")
    with pytest.raises(Exception, match="(?i)out of|invalid ind"):  # "indices element out of data bounds" and kin
        _onnxruntime(case.model, feeds)
    plan = compile_model(case.model, "cpu").plan.save(tmp_path / "p.tfplan")
    valid, _ = case.feeds(rng, "negative")
    result = _child(plan, feeds, valid, tmp_path)
    assert result["error"] == case.message(bad)
    _matches(result["after"], _onnxruntime(case.model, valid))


def test_one_hot_rows_of_out_of_range_indices_are_all_off_as_onnx_says():
    """OneHot defines out-of-range indices (outside [-depth, depth)): their rows hold only
    the off value. No check fails; the result is onnxruntime's."""
    m, feeds = one_hot_model(), one_hot_feeds(np.random.default_rng())
    got = tilefuse.InferenceSession(compile_model(m, "cpu").plan).run(None, feeds)
    want = _onnxruntime(m, feeds)
    np.testing.assert_array_equal(got[0], want[0])
    assert (got[0][0, :, :4] == -3.0).all()  # twice the off value


def test_constant_indices_out_of_range_are_a_conversion_error():
    inds = helper.make_tensor("indices", I64, [2], [0, 7])
    m = model(helper.make_node("Gather", ["data", "indices"], ["r"], name="the_op", axis=0),
              [("data", F, [5, 3])], [2, 3], inits=(inds,))
    with pytest.raises(ConversionError, match=r"Gather node 'the_op': indices hold 7, outside \[-5, 5\)"):
        compile_model(m, "cpu")


def test_indices_computed_in_the_graph_are_checked_and_named_by_their_node():
    """An index computed inside the model (here ids + 1) is checked too; with no graph
    input holding it, the message names the node that reads it."""
    g = helper.make_graph(
        [helper.make_node("Add", ["ids", "one"], ["shifted"], name="shift"),
         helper.make_node("Gather", ["table", "shifted"], ["y"], name="lookup")], "m",
        [helper.make_tensor_value_info("table", F, [4, 2]), helper.make_tensor_value_info("ids", I64, [3])],
        [helper.make_tensor_value_info("y", F, [3, 2])], [helper.make_tensor("one", I64, [], [1])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()
    sess = tilefuse.InferenceSession(compile_model(m, "cpu").plan)
    table = np.random.default_rng().standard_normal((4, 2)).astype(np.float32)
    ok = {"table": table, "ids": np.array([-5, 0, 2], np.int64)}
    _matches(sess.run(None, ok), _onnxruntime(m, ok))
    with pytest.raises(ExecutionError, match=r"^index 4 is outside \[-4, 4\) in the indices of Gather node 'lookup'$"):
        sess.run(None, {"table": table, "ids": np.array([0, 3, 1], np.int64)})


def test_the_cli_reports_an_out_of_range_id_in_one_line_and_exits_2(bert_plan, tmp_path):
    rng = np.random.default_rng()
    feeds = bert_feeds(rng)
    feeds["input_ids"][1, 5] = 2**40
    for name, a in feeds.items():
        np.save(tmp_path / f"{name}.npy", a)
    done = subprocess.run([sys.executable, "-m", "tilefuse", "run", str(bert_plan),
                           *(x for name in feeds for x in ("--input", f"{name}={tmp_path / name}.npy"))],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"tilefuse: error: {bert_message(2**40)}\n")
