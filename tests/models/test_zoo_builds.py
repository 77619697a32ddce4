"""The model zoo itself: every tiny model builds, is valid ONNX, runs in onnxruntime and
gives outputs of the declared shapes; each transformer's legacy (TorchScript, opset 14)
variant computes the same function as its dynamo variant; float16 tracks float32.

The first run builds the tiny zoo into the shared cache (about two minutes on two cores,
mostly the dynamo exports); later runs reuse it. Real-size builds run only with
TILEFUSE_ZOO_REAL=1 (they take minutes and several GB of disk).
"""
from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import models
from models.fp16 import to_float16
from models.registry import MAX_IR_VERSION

ZOO = models.ZOO
RUNNABLE = [n for n, s in ZOO.items() if s.runs_in_ort]
TRANSFORMERS = [n for n, s in ZOO.items()
                if s.family == "transformer" and not n.endswith("-legacy")]
FLOAT_TYPES = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16"}

EXPECTED_NAMES = {
    "bert", "bert-legacy", "gpt2", "gpt2-legacy", "llama", "llama-legacy", "vit", "vit-legacy",
    "resnet", "mobilenetv2", "unet", "mlp", "edge-broadcast", "edge-softmax13", "edge-split",
    "edge-gather-neg", "edge-where-cast-clip", "edge-conv-same", "edge-einsum", "edge-resize",
    "edge-custom-op", "yolo", "convnext", "efficientnet", "crnn", "whisper-encoder", "sbert", "bert-qdq",
}


def run(path, feeds: dict) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds)))


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """Max abs difference over the reference's largest magnitude (at least 1e-6)."""
    want = want.astype(np.float64)
    scale = max(float(np.abs(want).max(initial=0.0)), 1e-6)
    return float(np.abs(got.astype(np.float64) - want).max(initial=0.0)) / scale


def other_shapes(name: str) -> dict:
    """Tiny shapes with the dynamic dims moved: batch 3, and sequence 9 for text."""
    shapes = ZOO[name].shapes("tiny")
    if "pixel_values" in shapes:
        return {"pixel_values": (3, *shapes["pixel_values"][1:])}
    return {k: (3, 9) for k in shapes}


# ------------------------------------------------------------------- the zoo's interface


def test_zoo_lists_the_promised_models():
    assert EXPECTED_NAMES <= set(ZOO)
    for name, spec in ZOO.items():
        assert spec.name == name
        assert spec.family in models.FAMILIES
        assert spec.configs[0] == "tiny"
        for config in spec.configs:
            assert spec.shapes(config) and spec.output_shapes(config)
    assert [n for n, s in ZOO.items() if not s.runs_in_ort] == ["edge-custom-op"]
    assert set(ZOO["bert"].configs) == set(ZOO["resnet"].configs) == {"tiny", "real"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        ZOO["bert"].name = "x"


def test_unknown_name_config_or_dtype_is_refused(tmp_path):
    with pytest.raises(KeyError, match="no model"):
        models.build("bert-huge", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="configs"):
        models.build("unet", "real", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="dtype"):
        models.build("mlp", dtype="bfloat16", cache_dir=tmp_path)
    with pytest.raises(ValueError, match="bert-qdq is built in float32 only"):
        models.build("bert-qdq", dtype="float16", cache_dir=tmp_path)


# ------------------------------------------------------------------- every tiny model


@pytest.mark.parametrize("name,dtype", [(n, d) for n in ZOO for d in ZOO[n].dtypes])
def test_tiny_model_is_valid_and_runs(name, dtype, zoo_cache):
    spec = ZOO[name]
    path = models.build(name, "tiny", dtype, cache_dir=zoo_cache)
    assert path.name == f"{name}-tiny-{dtype}.onnx"
    model = onnx.load(str(path))
    assert model.ir_version <= MAX_IR_VERSION
    assert all(t.data_location != onnx.TensorProto.EXTERNAL for t in model.graph.initializer)
    onnx.checker.check_model(model, full_check=True)
    floats = {FLOAT_TYPES[v.type.tensor_type.elem_type]
              for v in [*model.graph.input, *model.graph.output]
              if v.type.tensor_type.elem_type in FLOAT_TYPES}
    assert floats == {dtype}, f"float inputs/outputs are {floats}"

    feeds = models.random_inputs(path, spec.shapes("tiny"), seed=0)
    if not spec.runs_in_ort:
        with pytest.raises(Exception, match="MyCustomOp|com.example"):
            run(path, feeds)
        return
    outputs = run(path, feeds)
    assert {k: v.shape for k, v in outputs.items()} == spec.output_shapes("tiny")
    for k, v in outputs.items():
        assert np.isfinite(v).all(), f"{k} has non-finite values"


# ------------------------------------------------------------------- numerical agreement


@pytest.mark.parametrize("dtype,tolerance", [("float32", 1e-4), ("float16", 1e-2)])
@pytest.mark.parametrize("name", TRANSFORMERS)
def test_legacy_variant_matches_dynamo_variant(name, dtype, tolerance, zoo_cache):
    """Same seed, same weights: the opset-14 spelled-out graph and the opset-20 fused one
    must compute the same function, at the traced shapes and at other ones."""
    dynamo = models.build(name, "tiny", dtype, cache_dir=zoo_cache)
    legacy = models.build(f"{name}-legacy", "tiny", dtype, cache_dir=zoo_cache)
    for shapes in (ZOO[name].shapes("tiny"), other_shapes(name)):
        feeds = models.random_inputs(dynamo, shapes, seed=1)
        want, got = run(dynamo, feeds), run(legacy, feeds)
        assert set(got) == set(want)
        for k in want:
            assert got[k].shape == want[k].shape
            err = relative_error(got[k], want[k])
            assert err <= tolerance, f"{k} at {shapes}: {err:.3g}"


@pytest.mark.parametrize("name", [n for n in RUNNABLE if "float16" in ZOO[n].dtypes])
def test_float16_tracks_float32(name, zoo_cache):
    path32 = models.build(name, "tiny", "float32", cache_dir=zoo_cache)
    path16 = models.build(name, "tiny", "float16", cache_dir=zoo_cache)
    feeds = models.random_inputs(path32, ZOO[name].shapes("tiny"), seed=2)
    want = run(path32, feeds)
    got = run(path16, {k: v.astype(np.float16) if v.dtype == np.float32 else v
                       for k, v in feeds.items()})
    for k in want:
        if want[k].dtype != np.float32:  # integer outputs (positions, counts) keep their type
            assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
            continue
        assert got[k].dtype == np.float16
        assert relative_error(got[k], want[k]) <= 1e-2, k


@pytest.mark.parametrize("name", ["bert", "bert-legacy", "llama-legacy", "resnet", "unet"])
def test_float16_converter_on_exported_graphs(name, zoo_cache):
    """fp16.to_float16 (used for the edge graphs) also handles real exporter output:
    Constant nodes, Cast targets, ConstantOfShape, Resize scales."""
    model32 = onnx.load(str(models.build(name, "tiny", "float32", cache_dir=zoo_cache)))
    model16 = to_float16(model32)
    onnx.checker.check_model(model16, full_check=True)
    feeds = models.random_inputs(model32, seed=3)
    want = run_model(model32, feeds)
    got = run_model(model16, {k: v.astype(np.float16) if v.dtype == np.float32 else v
                              for k, v in feeds.items()})
    for k in want:
        if want[k].dtype != np.float32:  # integer outputs (positions, counts) keep their type
            assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
            continue
        assert got[k].dtype == np.float16
        assert relative_error(got[k], want[k]) <= 1e-2, k


def run_model(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


# ------------------------------------------------------------------- inputs and cache


def test_random_inputs_are_valid_and_seeded(zoo_cache):
    path = models.build("bert", "tiny", "float32", cache_dir=zoo_cache)
    a = models.random_inputs(path, seed=5)  # shapes come from the model's metadata
    assert a.keys() == {"input_ids", "attention_mask"}
    assert a["input_ids"].shape == (2, 16) and a["input_ids"].dtype == np.int64
    assert 0 <= a["input_ids"].min() and a["input_ids"].max() < 100
    assert a["attention_mask"].sum(axis=1).min() > 0 and a["attention_mask"].min() == 0
    b = models.random_inputs(path, seed=5)
    c = models.random_inputs(path, seed=6)
    assert np.array_equal(a["input_ids"], b["input_ids"])
    assert not np.array_equal(a["input_ids"], c["input_ids"])
    wide = models.random_inputs(path, {"input_ids": (3, 9), "attention_mask": (3, 9)}, seed=0)
    assert wide["input_ids"].shape == (3, 9)

    gather = models.build("edge-gather-neg", "tiny", "float32", cache_dir=zoo_cache)
    idx = models.random_inputs(gather, {"idx": (1000,)}, seed=0)["idx"]
    assert idx.min() == -5 and idx.max() == 4


def test_random_inputs_needs_symbolic_dims_bound(tmp_path):
    model = onnx.load(str(models.build("edge-split", cache_dir=tmp_path)))
    del model.metadata_props[:]
    with pytest.raises(ValueError, match="symbolic"):
        models.random_inputs(model, seed=0)


def test_build_reuses_cache_and_rebuilds_stale(tmp_path):
    path = models.build("edge-einsum", cache_dir=tmp_path)
    sidecar = path.with_suffix(".json")
    info = json.loads(sidecar.read_text())
    assert info["bytes"] == path.stat().st_size

    stamp = path.stat().st_mtime_ns
    assert models.build("edge-einsum", cache_dir=tmp_path) == path
    assert path.stat().st_mtime_ns == stamp  # reused

    sidecar.write_text(json.dumps({**info, "key": "stale"}))
    models.build("edge-einsum", cache_dir=tmp_path)
    assert json.loads(sidecar.read_text())["key"] == info["key"]  # rebuilt

    os.utime(path, ns=(0, 0))
    models.build("edge-einsum", cache_dir=tmp_path, force=True)
    assert path.stat().st_mtime_ns != 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "edge-einsum-tiny-float32.json", "edge-einsum-tiny-float32.onnx"]  # no temp files left


def test_cache_dir_defaults_to_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEFUSE_MODEL_CACHE", str(tmp_path / "zoo"))
    assert models.build("edge-split") == tmp_path / "zoo" / "edge-split-tiny-float32.onnx"


# ------------------------------------------------------------------- real sizes


REAL = [(n, d) for n, s in ZOO.items() if "real" in s.configs for d in models.DTYPES]


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TILEFUSE_ZOO_REAL") != "1",
                    reason="real-size builds take minutes each; set TILEFUSE_ZOO_REAL=1")
@pytest.mark.parametrize("name,dtype", REAL)
def test_real_model_builds_and_runs(name, dtype, zoo_cache):
    spec = ZOO[name]
    path = models.build(name, "real", dtype, cache_dir=zoo_cache)
    onnx.checker.check_model(str(path), full_check=True)
    outputs = run(path, models.random_inputs(path, spec.shapes("real"), seed=0))
    assert {k: v.shape for k, v in outputs.items()} == spec.output_shapes("real")
    assert all(np.isfinite(v).all() for v in outputs.values())
