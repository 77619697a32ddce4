"""A plan records the precision it computes in; a manifest from before the field reads fp32."""
import json

import pytest
from onnx import TensorProto as T
from onnx import helper as h

import tilefuse
from tilefuse.errors import PlanError
from tilefuse.plan.files import write_manifest
from tilefuse.frontend.precision import PRECISIONS as FRONTEND_PRECISIONS
from tilefuse.plan import load_plan
from tilefuse.plan.model import PRECISIONS


def _relu():
    g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "m", [h.make_tensor_value_info("x", T.FLOAT, [4])],
                     [h.make_tensor_value_info("y", T.FLOAT, [4])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_precision_is_saved_and_read_back(tmp_path):
    assert set(PRECISIONS) == set(FRONTEND_PRECISIONS)
    path = tilefuse.compile(_relu(), precision="bf16").save(tmp_path / "p.tfplan")
    assert load_plan(path).precision == "bf16"
    manifest = path / "manifest.json"
    data = json.loads(manifest.read_text())
    del data["precision"]  # a plan written before the field
    write_manifest(path, data)
    assert load_plan(path).precision == "fp32"
    data["precision"] = "fp8"
    write_manifest(path, data)
    with pytest.raises(PlanError, match=r"precision: expected one of .*got 'fp8'"):
        load_plan(path)
