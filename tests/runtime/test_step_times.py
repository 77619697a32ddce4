"""A profile's run (``InferenceSession.step_times``): every step a run takes, in order,
each with its own time, host steps included; a branch times only the path taken. The
facts a plan records per step survive saving and loading, and plans without them load."""
from __future__ import annotations

import json

import numpy as np

import tilefuse
from tilefuse.plan import BranchStep, HostStep, KernelStep, load_plan, step_order
from tilefuse.plan.files import MANIFEST, write_manifest
from tilefuse.runtime import InferenceSession

from tests.compiler.if_models import sum_switch_model
from tests.plan.handmade import random_feeds, topk_plan


def test_every_step_in_order_host_steps_included(tmp_path):
    graph, plan = topk_plan(tmp_path)
    with InferenceSession(plan) as sess:
        times = sess.step_times(random_feeds(graph))
    assert [i for i, _ in times] == list(range(len(plan.steps)))
    assert any(isinstance(plan.steps[i], HostStep) for i, _ in times)
    assert all(seconds > 0 for _, seconds in times)


def test_a_branch_times_the_path_taken(tmp_path):
    plan = tilefuse.compile(sum_switch_model(), "cpu")
    with InferenceSession(plan) as sess:
        for offset in (-1.0, 1.0):
            x = (np.random.default_rng(0).standard_normal((2, 3, 8, 8)) + offset).astype(np.float32)
            ran = [i for i, _ in sess.step_times({"x": x})]
            taken = [i for i in step_order(plan.steps, lambda b: offset > 0)
                     if not isinstance(plan.steps[i], BranchStep)]
            assert ran == taken


def test_facts_round_trip_and_plans_without_them_load(tmp_path):
    plan = tilefuse.compile(sum_switch_model(), "cpu")
    saved = load_plan(plan.save(tmp_path / "p.tfplan"))
    kernels = [s for s in saved.steps if isinstance(s, KernelStep)]
    assert [s.facts for s in kernels] == [s.facts for s in plan.steps if isinstance(s, KernelStep)]
    for s in kernels:
        f = s.facts
        assert f.onnx_nodes and f.onnx_ops and f.bound in ("compute", "memory")
        assert 0 < f.floor_seconds < f.estimated_seconds and f.bytes > 0
    assert any("Conv" in s.facts.onnx_ops for s in kernels)  # a branch's nodes: named by their subgraph
    manifest = json.loads((tmp_path / "p.tfplan" / MANIFEST).read_text())
    for step in manifest["steps"]:
        step.pop("facts", None)
    write_manifest(tmp_path / "p.tfplan", manifest)
    old = load_plan(tmp_path / "p.tfplan")
    assert all(getattr(s, "facts", None) is None for s in old.steps)
