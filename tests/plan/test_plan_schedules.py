"""A plan records each kernel's schedule (issue 16, item 4): the JSON form of the record
its lowering made, written in manifest.json and read back as it was; a corrupt record is a
PlanError naming the field, and plans that do not record one load with none."""
from __future__ import annotations

import json

import pytest

from tilefuse.compiler import compile_graph
from tilefuse.errors import PlanError
from tilefuse.plan import load_plan
from tilefuse.plan.files import write_manifest
from tilefuse.target import CPU

from tests.plan.handmade import mlp_graph


def _saved(tmp_path):
    compiled = compile_graph(mlp_graph(8, 16, 32), CPU)
    return compiled, compiled.plan.save(tmp_path / "a.tfplan")


def test_each_kernel_keeps_its_schedule_through_save_and_load(tmp_path):
    compiled, path = _saved(tmp_path)
    plan = compiled.plan
    by_name = {low.program.name: low.program for low in compiled.lowered.values()}
    assert plan.kernels and all(k.schedule["family"] == "gemm" for k in plan.kernels.values())
    for step in (s for s in plan.steps if hasattr(s, "kernel")):
        program = by_name[compiled.lowered[step.group].program.name]
        assert plan.kernels[step.kernel].schedule == program.schedule.to_json()
    loaded = load_plan(path)
    assert {n: k.schedule for n, k in loaded.kernels.items()} == {n: k.schedule for n, k in plan.kernels.items()}


@pytest.mark.parametrize("schedule,message", [
    ([], "schedule: expected an object"),
    ({"tile_m": 64}, "schedule.family: expected a schedule family name"),
    ({"family": "gemm; rm"}, "schedule.family: expected a schedule family name"),
    ({"family": "gemm", "tile": {"m": 64}}, "schedule.tile: expected a number"),
    ({"family": "gemm", "tile": list(range(65))}, "schedule.tile: 65 items"),
    ({"family": "gemm", "tiles": [[[1]]]}, r"schedule.tiles\[0\]\[0\]: expected a number"),
    ({"family": "gemm", "m": 10**30}, "schedule.m: .* is outside"),
    ({"family": "gemm", "reason": "x" * 5000}, "schedule.reason: a string of 5000"),
    ({"family": "gemm", "bad key": 1}, "schedule: field name 'bad key'"),
    ({"family": "gemm", **{f"f{i}": 1 for i in range(64)}}, "schedule: 65 fields"),
])
def test_a_corrupt_schedule_is_a_plan_error(tmp_path, schedule, message):
    _, path = _saved(tmp_path)
    m = json.loads((path / "manifest.json").read_text())
    m["kernels"][0]["schedule"] = schedule
    write_manifest(path, m)
    with pytest.raises(PlanError, match=r"kernels\[0\]\." + message):
        load_plan(path)


def test_a_plan_without_schedules_loads_with_none(tmp_path):
    _, path = _saved(tmp_path)
    m = json.loads((path / "manifest.json").read_text())
    for k in m["kernels"]:
        del k["schedule"]
    write_manifest(path, m)
    assert all(k.schedule == {} for k in load_plan(path).kernels.values())
