"""export-ort reads its model as `optimize` does: dims declared -1 are dynamic (bound by
--shape), and external weights of a model given as a ModelProto come from the folder the
caller names, never from the working directory."""
from __future__ import annotations

import os
import random

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.ort.helpers import reference
from tilefuse.compare import compare_output
from tilefuse.errors import ModelLoadError
from tilefuse.ort import export_ort


def _matmul_model(dim0: int | str) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [dim0, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [dim0, 64])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _check(result, path, rows: int) -> None:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.register_custom_ops_library(str(result.library))
    seed = random.randrange(2**31)
    x = np.random.default_rng(seed).standard_normal((rows, 8)).astype(np.float32)
    (got,) = ort.InferenceSession(str(result.model_path), so).run(None, {"x": x})
    c = compare_output("y", got, reference(path, {"x": x})["y"])
    assert c.ok, f"seed={seed}: {c.problem}"


def test_a_dim_declared_minus_one_is_dynamic(tmp_path):
    model = _matmul_model("batch")
    model.graph.input[0].type.tensor_type.shape.dim[0].Clear()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -1
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    result = export_ort(path, tmp_path / "out", "cpu", {"x": (3, 8)}, "custom-ops")
    assert result.claimed_nodes == 2 and not result.kept
    _check(result, path, 3)


def test_external_weights_of_a_proto_come_from_the_named_folder(tmp_path, monkeypatch):
    folder = tmp_path / "weights"
    folder.mkdir()
    path = folder / "m.onnx"
    onnx.save(_matmul_model(4), str(path), save_as_external_data=True, location="m.data", size_threshold=0)
    proto = onnx.load(str(path), load_external_data=False)
    monkeypatch.chdir(folder)  # the data is in the working directory: it must still not be read from there
    with pytest.raises(ModelLoadError, match="external"):
        export_ort(proto, tmp_path / "out", "cpu", mode="custom-ops")
    monkeypatch.chdir(tmp_path)
    result = export_ort(proto, tmp_path / "out", "cpu", mode="custom-ops", external_data_dir=folder)
    _check(result, path, 4)
    assert os.path.isfile(result.model_path)
