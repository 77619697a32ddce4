"""A model with ops tilefuse does not run: those nodes stay ordinary ONNX nodes on
onnxruntime's CPU provider, the export says which, and the whole model still matches."""
import random

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.ort.helpers import data_dependent_model, mixed_model, reference
from tilefuse.cli.main import main
from tilefuse.compare import compare_output
from tilefuse.ort import export_ort
from tilefuse.ort.segment import regions

KEPT = {"det", "topk"}  # Det: no converter; TopK: a tilefuse host step


def test_regions_are_convex_around_kept_nodes():
    model = mixed_model()
    groups = [[n.name for n in r] for r in regions(model, KEPT)]
    # sum bypasses det but mul reads det: {matmul, add, relu, sum} first, then {mul, tanh}, then {square}
    assert groups == [["matmul", "add", "relu", "sum"], ["mul", "tanh"], ["square"]]


@pytest.mark.parametrize("mode", ["ep", "custom-ops"])
def test_unsupported_nodes_stay_with_onnxruntime(mode, mixed_path, tmp_path, ep_options):
    result = export_ort(mixed_path, tmp_path, "cpu", {"batch": 4}, mode)
    assert {k.name for k in result.kept} == KEPT
    assert "no tilefuse converter" in next(k.reason for k in result.kept if k.name == "det")
    model = onnx.load(str(result.model_path), load_external_data=False)
    tilefuse_op = "EPContext" if mode == "ep" else "FusedKernel"
    assert sorted(n.op_type for n in model.graph.node if n.op_type != tilefuse_op) == ["Det", "TopK"]
    assert model.ir_version <= 10
    if mode == "ep":
        so = ep_options()
    else:
        so = ort.SessionOptions()
        so.register_custom_ops_library(str(result.library))
    sess = ort.InferenceSession(str(result.model_path), so)
    seed = random.randrange(2**31)
    x = np.random.default_rng(seed).standard_normal((4, 3, 3)).astype(np.float32)
    got = sess.run(None, {"x": x})
    want = reference(mixed_path, {"x": x})
    for name, g in zip(["y", "z"], got):
        c = compare_output(name, g, want[name])
        assert c.ok, f"seed={seed}: {name}: {c.problem}"


def test_cli_says_which_nodes_stayed(mixed_path, tmp_path, capsys):
    code = main(["export-ort", str(mixed_path), "-o", str(tmp_path / "out"), "--shape", "batch=4"])
    out = capsys.readouterr().out
    assert code == 0
    assert "2 node(s) stay with onnxruntime" in out
    assert "det (Det): no tilefuse converter" in out and "topk (TopK)" in out
    assert (tmp_path / "out" / "model.onnx").is_file()


def test_cli_errors_are_one_line(tmp_path, capsys):
    code = main(["export-ort", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "no such file" in err


def test_values_of_data_dependent_shape_stay_with_onnxruntime(tmp_path, ep_options):
    path = tmp_path / "dd.onnx"
    onnx.save(data_dependent_model(), str(path))
    result = export_ort(path, tmp_path / "out", "cpu", None, "ep")
    kept = {k.name: k.reason for k in result.kept}
    assert set(kept) == {"unique", "square"}
    assert "reads u, whose shape" in kept["square"]
    assert result.claimed_nodes == 2 and result.kernel_nodes >= 1
    x = np.array([1, -2, 3, 3, 0, 1], np.float32)
    got = ort.InferenceSession(str(result.model_path), ep_options()).run(None, {"x": x})
    want = reference(path, {"x": x})
    np.testing.assert_array_equal(got[0], want["y"])
    np.testing.assert_array_equal(got[1], want["z"])
