"""Index check sites in plans: a kernel step that checks indices carries its sites, its
kernel takes the status word last, and both survive saving and loading; a manifest whose
sites and kernel disagree is refused."""
import json

import numpy as np
import pytest
from onnx import TensorProto, helper

from tilefuse.plan.files import write_manifest
from tilefuse.compiler import compile_model
from tilefuse.errors import PlanError
from tilefuse.plan import IndexSite, load_plan


def _model() -> bytes:
    g = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["g"], name="lookup"),
         helper.make_node("Relu", ["g"], ["y"], name="relu")], "m",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2])],
        [helper.make_tensor("table", TensorProto.FLOAT, [4, 2], np.arange(8, dtype=np.float32))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


def test_sites_and_the_status_param_round_trip(tmp_path):
    plan = compile_model(_model(), "cpu").plan
    (step,) = [s for s in plan.steps if s.sites]
    assert step.sites == (IndexSite("input 'ids' (the indices of Gather node 'lookup')", 4),)
    assert plan.checked_steps() == [plan.steps.index(step)]
    assert plan.kernels[step.kernel].params[-1].role == "status"
    loaded = load_plan(plan.save(tmp_path / "p.tfplan"))
    assert [s.sites for s in loaded.steps] == [s.sites for s in plan.steps]


@pytest.mark.parametrize("edit,match", [
    (lambda step: step.pop("sites"), "arguments for"),  # a status param nobody fills
    (lambda step: step["sites"].append({"what": "more", "extent": 0}), "empty axis"),
    (lambda step: step["sites"].__setitem__(0, {"what": 1, "extent": 4}), "what"),
])
def test_a_manifest_whose_sites_and_kernel_disagree_is_refused(tmp_path, edit, match):
    path = compile_model(_model(), "cpu").plan.save(tmp_path / "p.tfplan")
    manifest = json.loads((path / "manifest.json").read_text())
    edit(next(s for s in manifest["steps"] if "sites" in s))
    write_manifest(path, manifest)
    with pytest.raises(PlanError, match=match):
        load_plan(path)


def test_a_kernel_without_a_status_param_cannot_take_sites(tmp_path):
    path = compile_model(_model(), "cpu").plan.save(tmp_path / "p.tfplan")
    manifest = json.loads((path / "manifest.json").read_text())
    for k in manifest["kernels"]:
        k["params"] = [p for p in k["params"] if p["role"] != "status"]
    write_manifest(path, manifest)
    with pytest.raises(PlanError, match="takes no status word"):
        load_plan(path)
