"""The .tfplan directory: save, load in a fresh process, and every corruption a PlanError."""
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tilefuse.plan.files import write_manifest
from tilefuse.errors import PlanError
from tilefuse.plan import FORMAT_VERSION, load_plan
from tilefuse.reference import run_graph

from tests.plan.handmade import mlp_plan, random_feeds, topk_plan

REPO = Path(__file__).resolve().parents[2]

RUN_IN_FRESH_PROCESS = """
import sys
from safetensors.numpy import load_file, save_file  # keeps bfloat16, which .npz does not
from tilefuse.runtime import InferenceSession
sess = InferenceSession(sys.argv[1])
names = [o.name for o in sess.get_outputs()]
save_file(dict(zip(names, sess.run(None, load_file(sys.argv[2])))), sys.argv[3])
"""


@pytest.mark.parametrize("make", [mlp_plan, topk_plan], ids=["mlp", "topk"])
def test_save_load_run_in_fresh_process(tmp_path, make):
    graph, plan = make(tmp_path / "build")
    path = plan.save(tmp_path / "model.tfplan")
    feeds = random_feeds(graph, seed=7)
    save_file(feeds, tmp_path / "feeds.safetensors")
    files = [str(path), str(tmp_path / "feeds.safetensors"), str(tmp_path / "out.safetensors")]
    subprocess.run([sys.executable, "-c", RUN_IN_FRESH_PROCESS, *files], check=True, cwd=REPO)
    got = load_file(tmp_path / "out.safetensors")
    ref = run_graph(graph, feeds)
    assert sorted(got) == sorted(ref)
    for name in ref:
        assert got[name].dtype == ref[name].dtype
        np.testing.assert_allclose(got[name].astype(np.float64), ref[name].astype(np.float64), rtol=1e-5, atol=1e-5)


@pytest.fixture
def saved(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plan")
    _, plan = topk_plan(tmp / "build")
    return plan.save(tmp / "model.tfplan")


def test_layout_and_manifest(saved):
    assert sorted(p.name for p in saved.iterdir()) == ["kernels", "manifest.json", "manifest.sha256", "weights.safetensors"]
    m = json.loads((saved / "manifest.json").read_text())
    assert m["format_version"] == FORMAT_VERSION and m["target"] == "cpu"
    assert [s["op"] for s in m["steps"]] == ["kernel", "host", "kernel"]
    assert m["steps"][1]["primitive"] == "TopK"
    assert m["steps"][1]["params"] == {"axis": 1, "k": 4, "largest": True, "sorted": True}
    for k in m["kernels"]:
        assert (saved / k["file"]).is_file()
    constants = {b["name"] for b in m["buffers"] if b["kind"] == "constant"}
    assert set(load_file(saved / "weights.safetensors")) == constants
    assert m["arena_bytes"] <= m["intermediate_bytes"]


def test_loaded_plan_equals_saved(tmp_path):
    _, plan = mlp_plan(tmp_path / "build")
    loaded = load_plan(plan.save(tmp_path / "m.tfplan"))
    assert loaded.buffers == plan.buffers and loaded.steps == plan.steps
    assert loaded.inputs == plan.inputs and loaded.outputs == plan.outputs
    for name, w in plan.weights.items():
        assert loaded.weights[name].dtype == w.dtype and np.array_equal(loaded.weights[name], w)
    # Saving over an existing plan replaces it.
    assert load_plan(loaded.save(tmp_path / "m.tfplan")).steps == plan.steps


def _edit_manifest(path, edit):
    m = json.loads((path / "manifest.json").read_text())
    edit(m)
    write_manifest(path, m)


def test_truncated_manifest(saved):
    text = (saved / "manifest.json").read_bytes()
    (saved / "manifest.json").write_bytes(text[: len(text) // 2])
    with pytest.raises(PlanError, match=r"manifest\.json: truncated or not valid JSON"):
        load_plan(saved)


def test_missing_manifest_or_directory(saved, tmp_path):
    with pytest.raises(PlanError, match="not a plan directory"):
        load_plan(tmp_path / "nothing.tfplan")
    (saved / "manifest.json").unlink()
    with pytest.raises(PlanError, match=r"manifest\.json: missing"):
        load_plan(saved)


def test_version_mismatch(saved):
    _edit_manifest(saved, lambda m: m.update(format_version=FORMAT_VERSION + 1))
    with pytest.raises(PlanError, match=f"format version {FORMAT_VERSION + 1} .* reads version {FORMAT_VERSION}; compile the model again"):
        load_plan(saved)


def test_missing_kernel_file(saved):
    next((saved / "kernels").iterdir()).unlink()
    with pytest.raises(PlanError, match=r"kernels/k\d+_.*\.so: kernel file missing"):
        load_plan(saved)


def test_modified_kernel_file(saved):
    kernel = next((saved / "kernels").iterdir())
    kernel.write_bytes(kernel.read_bytes() + b"\0")
    with pytest.raises(PlanError, match=r"\.so: sha256 .* differs from the manifest's"):
        load_plan(saved)


def _replace_weights(path, tensors=None, raw=None):
    """Write other weights and their hash into the manifest, as an editing author would:
    what the checks behind the hash see."""
    if tensors is not None:
        save_file(tensors, path / "weights.safetensors")
    else:
        (path / "weights.safetensors").write_bytes(raw)
    sha = hashlib.sha256((path / "weights.safetensors").read_bytes()).hexdigest()
    _edit_manifest(path, lambda m: m.update(weights_sha256=sha))


def test_weights_missing_tensor_or_wrong_shape(saved):
    weights = load_file(saved / "weights.safetensors")
    _replace_weights(saved, {k: v for k, v in weights.items() if k != "w"})
    with pytest.raises(PlanError, match="weights.safetensors: no tensor 'w'"):
        load_plan(saved)
    _replace_weights(saved, {**weights, "w": weights["w"][:4]})
    with pytest.raises(PlanError, match=r"tensor 'w' is float32\[4, 16\], expected float32\[8, 16\]"):
        load_plan(saved)
    _replace_weights(saved, {**weights, "w": weights["w"].astype(np.float64)})
    with pytest.raises(PlanError, match="tensor 'w' is float64"):
        load_plan(saved)
    _replace_weights(saved, raw=b"\x10\x00")
    with pytest.raises(PlanError, match="weights.safetensors: cannot read"):
        load_plan(saved)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: m["steps"][1].update(primitive="Eval"), "unknown host primitive 'Eval'"),
        (lambda m: m["steps"][1]["params"].update(k="4"), r"TopK\.k: expected int, got '4'"),
        (lambda m: m["steps"][1]["params"].update(k=True), r"TopK\.k: expected int, got True"),
        (lambda m: m["steps"][1]["params"].update(code="x"), r"TopK has no parameter\(s\) \['code'\]"),
        (lambda m: m["steps"][1]["params"].update(k=5), r"host step TopK .* computes"),
        (lambda m: m["steps"][0].update(op="python"), "unknown step op 'python'"),
        (lambda m: m["steps"][0].update(inputs=[0, 1, 2]), "4 arguments for 5 params"),
        (lambda m: m["steps"][2]["inputs"].__setitem__(0, 99), "buffer 99 does not exist"),
        (lambda m: m["kernels"][0].update(file="../../../lib.so"), "must be the plan's own 'kernels/k0_"),
        (lambda m: m["kernels"][0].update(file="/usr/lib/libc.so.6"), "must be the plan's own 'kernels/k0_"),
        (lambda m: m["buffers"][4].update(offset=8), "not a multiple of 64"),
        (lambda m: m.update(arena_bytes=64), "ends past the arena"),
        (lambda m: m["buffers"][0].update(shape=[4, 9], nbytes=144), r"inputs\[0\]: type .* differs from buffer 0"),
        (lambda m: m["buffers"][1].update(nbytes=3), r"buffers\[1\]\.nbytes"),
        (lambda m: m.pop("steps"), "missing field 'steps'"),
        (lambda m: m["buffers"][0].update(dtype="float128"), "unknown dtype 'float128'"),
    ],
)
def test_corrupt_manifest(saved, edit, message):
    _edit_manifest(saved, edit)
    with pytest.raises(PlanError, match=message):
        load_plan(saved)


def test_refuses_to_overwrite_other_directories(tmp_path):
    _, plan = mlp_plan(tmp_path / "build")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "notes.txt").write_text("mine")
    with pytest.raises(PlanError, match="not a plan; refusing"):
        plan.save(tmp_path / "docs")
    assert (tmp_path / "docs" / "notes.txt").read_text() == "mine"
