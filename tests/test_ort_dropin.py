"""tilefuse.InferenceSession as an onnxruntime drop-in (issue 17, item 1): one script written
for onnxruntime runs unchanged against both (create with options and providers, inputs and
outputs, run with names, io_binding, model metadata, profiling); a model with dynamic dims is
compiled for the shapes it is run with, one plan per set of shapes, cached on disk."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime
import pytest

import tilefuse
from tilefuse.errors import InputError, PlanError

MODEL = str(Path(__file__).resolve().parent.parent / "examples" / "bert-tiny.onnx")


def ort_script(rt, path: str, batch: int = 2, seq: int = 16):
    """Code as a user writes it for onnxruntime; ``rt`` is onnxruntime or tilefuse."""
    so = rt.SessionOptions()
    so.intra_op_num_threads = 1
    so.enable_profiling = True
    sess = rt.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    inputs = [(i.name, i.shape, i.type) for i in sess.get_inputs()]
    outputs = [o.name for o in sess.get_outputs()]
    rng = np.random.default_rng(7)
    feeds = {"input_ids": rng.integers(0, 100, (batch, seq)), "attention_mask": np.ones((batch, seq), np.int64)}
    feeds["attention_mask"][:, seq // 2:] = rng.integers(0, 2, (batch, seq - seq // 2))
    by_name = sess.run([outputs[1], outputs[0]], feeds)
    binding = sess.io_binding()
    for name, value in feeds.items():
        binding.bind_cpu_input(name, value)
    binding.bind_output(outputs[0])
    sess.run_with_iobinding(binding)
    bound = binding.copy_outputs_to_cpu()[0]
    also = binding.get_outputs()[0].numpy()
    meta = sess.get_modelmeta()
    profile = sess.end_profiling()
    return {"inputs": inputs, "outputs": outputs, "by_name": by_name, "bound": bound, "also": also,
            "meta": (meta.graph_name, meta.producer_name, dict(meta.custom_metadata_map)), "profile": profile}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEFUSE_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)  # profiles are written to the working directory
    return tmp_path / "cache"


def test_one_onnxruntime_script_runs_against_both(cache):
    want, got = ort_script(onnxruntime, MODEL), ort_script(tilefuse, MODEL)
    assert got["inputs"] == want["inputs"] and got["outputs"] == want["outputs"] and got["meta"] == want["meta"]
    for g, w in zip(got["by_name"], want["by_name"]):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got["bound"], want["bound"], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(got["also"], got["bound"])
    events = json.loads(Path(got["profile"]).read_text())
    assert len(events) == 2 and all(e["dur"] > 0 for e in events)  # the two runs


def test_dynamic_dims_compile_per_shape_and_plans_are_cached(cache, monkeypatch):
    sess = tilefuse.InferenceSession(MODEL)
    with pytest.raises(InputError, match="no plan yet"):
        sess.plan
    for batch, seq in ((2, 16), (1, 8), (2, 16)):
        ids = np.random.default_rng(batch).integers(0, 100, (batch, seq))
        want = onnxruntime.InferenceSession(MODEL).run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
        got = sess.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
        assert sess.plan.input_types()[0][1].shape == (batch, seq)
    assert len(list((cache / "plans").iterdir())) == 2
    from tilefuse import compiler

    monkeypatch.setattr(compiler, "compile", lambda *a, **k: pytest.fail("compiled although cached"))
    again = tilefuse.InferenceSession(MODEL)
    ids = np.zeros((1, 8), np.int64) + 3
    assert again.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0].shape == (1, 8, 64)


def test_bound_dims_compile_at_creation_and_options_are_read(cache):
    so = tilefuse.SessionOptions()
    so.add_free_dimension_override_by_name("batch", 1)
    so.add_free_dimension_override_by_name("seq", 4)
    sess = tilefuse.InferenceSession(MODEL, so)
    assert sess.plan.input_types()[0][1].shape == (1, 4) and sess.get_inputs()[0].shape == [1, 4]
    assert sess.get_providers() == ["TilefuseExecutionProvider"] and sess.get_session_options() is so
    assert tilefuse.InferenceSession(MODEL, shapes={"input_ids": (3, 5)}).plan.input_types()[1][1].shape == (3, 5)
    ort_options = onnxruntime.SessionOptions()
    ort_options.intra_op_num_threads = 1
    assert tilefuse.InferenceSession(MODEL, ort_options, shapes={"batch": 1, "seq": 4}).threads == 1


def test_host_buffers_bound_by_pointer(cache):
    sess = tilefuse.InferenceSession(MODEL, shapes={"batch": 1, "seq": 4})
    ids, mask = np.array([[5, 6, 7, 8]]), np.ones((1, 4), np.int64)
    out = np.empty((1, 4, 64), np.float32)
    b = sess.io_binding()
    b.bind_input("input_ids", "cpu", 0, np.int64, ids.shape, ids.ctypes.data)
    b.bind_input("attention_mask", "cpu", 0, np.int64, mask.shape, mask.ctypes.data)
    b.bind_output("last_hidden_state", "cpu", 0, np.float32, out.shape, out.ctypes.data)
    sess.run_with_iobinding(b)
    (want,) = sess.run(["last_hidden_state"], {"input_ids": ids, "attention_mask": mask})
    np.testing.assert_array_equal(out, want)  # written into the caller's buffer
    b.bind_input("input_ids", "cuda", 0, np.int64, ids.shape, ids.ctypes.data)  # GPU memory, as far as it knows
    with pytest.raises(InputError, match="a cpu plan takes host feeds"):
        sess.run_with_iobinding(b)
    with pytest.raises(InputError, match="device_type must be 'cpu' or 'cuda'"):
        b.bind_input("input_ids", "dml", 0, np.int64, ids.shape, ids.ctypes.data)
    with pytest.raises(InputError, match="CUDA device 1"):
        b.bind_output("last_hidden_state", "cuda", 1, np.float32, out.shape, out.ctypes.data)


def test_plans_and_errors(cache, tmp_path):
    plan = tilefuse.compile(MODEL, shapes={"batch": 1, "seq": 4})
    path = plan.save(tmp_path / "m.tfplan")
    sess = tilefuse.InferenceSession(str(path))
    assert sess.get_inputs()[0].shape == [1, 4] and sess.get_modelmeta().graph_name == "main_graph"
    with pytest.raises(PlanError):
        tilefuse.InferenceSession(str(tmp_path / "missing.tfplan"))
    with pytest.raises(InputError, match="unknown input"):
        tilefuse.InferenceSession(MODEL).run(None, {"nope": np.zeros((1, 4), np.int64)})


def test_run_options_that_disable_synchronisation_reach_the_plan_session(cache, monkeypatch):
    """onnxruntime's ``disable_synchronize_execution_providers`` run entry is a run not
    waited for (runtime/cuda.py: GPU feeds' outputs ordered on their stream); a CPU run is
    done when it returns either way, with the same outputs."""
    from tilefuse.runtime import InferenceSession as PlanSession

    waits = []
    real = PlanSession.run
    monkeypatch.setattr(PlanSession, "run", lambda self, names, feeds, wait=True: waits.append(wait)
                        or real(self, names, feeds, wait=wait))
    sess = tilefuse.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
    ids = np.random.default_rng().integers(0, 100, (1, 8))
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    unsynced = onnxruntime.RunOptions()
    unsynced.add_run_config_entry("disable_synchronize_execution_providers", "1")
    a = sess.run(None, feeds, unsynced)
    b = sess.run(None, feeds, onnxruntime.RunOptions())
    c = sess.run(None, feeds)
    assert waits == [False, True, True]
    for x, y, z in zip(a, b, c):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(x, z)
