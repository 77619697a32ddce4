"""export-ort on models with an ONNX If. A condition known only at run time: the If
stays with onnxruntime (which runs it natively), everything around it becomes tilefuse
kernels. With the condition's input bound (``consts=``, ``--const``): the branch taken is
compiled like the rest, and the exported model no longer takes that input."""
from __future__ import annotations

import random

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.compiler.if_models import sample_rate_model, sum_switch_model
from tests.ort.helpers import computed_ops, export_session, reference
from tilefuse.cli.main import main
from tilefuse.compare import compare_output
from tilefuse.ort import export_ort
from tilefuse.ort.segment import node_reads



def _check(result, source, feeds_list, ep_options, seed):
    sess = export_session(result, ep_options)
    names = {i.name for i in sess.get_inputs()}
    for feeds in feeds_list:
        (got,) = sess.run(None, {k: v for k, v in feeds.items() if k in names})
        c = compare_output("y", got, reference(source, feeds)["y"])
        assert c.ok, f"seed={seed}: {c.problem}"


def test_an_if_reads_from_outside_only_what_its_branches_do_not_define():
    (node,) = [n for n in sum_switch_model().graph.node if n.op_type == "If"]
    # conv and mm are computed inside the branches: no region has to provide them
    assert set(node_reads(node)) == {"positive", "x2", "wc", "bc", "x", "wm"}


@pytest.mark.parametrize("mode", ["ep", "custom-ops"])
def test_run_time_if_stays_with_onnxruntime_around_tilefuse_kernels(mode, tmp_path, ep_options):
    path = tmp_path / "switch.onnx"
    onnx.save(sum_switch_model(), str(path))
    result = export_ort(path, tmp_path / "out", "cpu", None, mode)
    assert [k.name for k in result.kept] == ["switch"]
    assert "condition known only at run time (from ['x'])" in result.kept[0].reason
    assert computed_ops(result) == ["If"] and result.kernel_nodes >= 2
    seed = random.randrange(2**31)
    rng = np.random.default_rng(seed)
    feeds = [{"x": (rng.standard_normal((2, 3, 8, 8)) + offset).astype(np.float32)} for offset in (-1.0, 1.0)]
    _check(result, path, feeds, ep_options, seed)


@pytest.mark.parametrize("rate", [16000, 8000])
def test_bound_condition_is_compiled_into_the_branch_taken(rate, tmp_path, ep_options):
    path = tmp_path / "rate.onnx"
    onnx.save(sample_rate_model(), str(path))
    result = export_ort(path, tmp_path / "out", "cpu", None, "ep", consts={"sample_rate": rate})
    assert result.kept == [] and computed_ops(result) == []
    exported = onnx.load(str(result.model_path), load_external_data=False)
    assert [i.name for i in exported.graph.input] == ["audio"]
    seed = random.randrange(2**31)
    audio = np.random.default_rng(seed).standard_normal((1, 16, 32)).astype(np.float32)
    _check(result, path, [{"audio": audio, "sample_rate": np.array(rate, np.int64)}], ep_options, seed)


def test_branches_of_different_shapes_keep_only_the_if(tmp_path, ep_options, capsys):
    path = tmp_path / "rate.onnx"
    onnx.save(sample_rate_model(else_shape=(1, 32, 16)), str(path))
    result = export_ort(path, tmp_path / "out", "cpu", None, "ep")
    kept = {k.name: k.reason for k in result.kept}
    assert "different output types" in kept["rate_switch"] and "is16k" not in kept
    seed = random.randrange(2**31)
    audio = np.random.default_rng(seed).standard_normal((1, 16, 32)).astype(np.float32)
    feeds = [{"audio": audio, "sample_rate": np.array(r, np.int64)} for r in (16000, 44100)]
    _check(result, path, feeds, ep_options, seed)
    out = tmp_path / "bound"
    assert main(["export-ort", str(path), "-o", str(out), "--const", "sample_rate=44100"]) == 0
    assert "no node stays with onnxruntime" in capsys.readouterr().out
    sess = ort.InferenceSession(str(out / "model.onnx"), ep_options())
    (got,) = sess.run(None, {"audio": audio})
    assert got.shape == (1, 32, 16)
    c = compare_output("y", got, reference(path, feeds[1])["y"])
    assert c.ok, f"seed={seed}: {c.problem}"
