"""Every tiny zoo model exported with export-ort runs inside onnxruntime, through the
plugin execution provider and through the custom-op library, and matches plain
onnxruntime on fresh random inputs (float32: 1e-4 of the output's scale)."""
import random

import onnx
import onnxruntime as ort
import pytest

import models
from tests.ort.helpers import RUNNABLE, reference
from tilefuse.compare import compare_output
from tilefuse.frontend.qdq import checked_precision


def _check(name, path, result, options):
    shapes = models.ZOO[name].shapes("tiny")
    seed = random.randrange(2**31)
    feeds = models.random_inputs(path, shapes, seed=seed)
    sess = ort.InferenceSession(str(result.model_path), options)
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    want = reference(path, feeds)
    assert set(got) == set(want)
    for out, w in want.items():
        c = compare_output(out, got[out], w, precision=checked_precision(path))
        assert c.ok, f"{name} seed={seed}: {out}: {c.problem}"


def _tilefuse_nodes(result, op_type):
    model = onnx.load(str(result.model_path), load_external_data=False)
    ops = [n.op_type for n in model.graph.node]
    assert result.kernel_nodes == ops.count(op_type) > 0
    return ops


@pytest.mark.parametrize("name", RUNNABLE)
def test_plugin_ep_matches_onnxruntime(name, exports, ep_options):
    path, result = exports(name, "ep")
    assert result.kept == []  # the zoo is fully supported: every node becomes a tilefuse kernel
    ops = _tilefuse_nodes(result, "EPContext")
    assert set(ops) <= {"EPContext", "Identity"}
    _check(name, path, result, ep_options())


@pytest.mark.parametrize("name", RUNNABLE)
def test_custom_op_library_matches_onnxruntime(name, exports):
    path, result = exports(name, "custom-ops")
    ops = _tilefuse_nodes(result, "FusedKernel")
    assert set(ops) <= {"FusedKernel", "Identity"}
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(result.library))
    _check(name, path, result, so)
