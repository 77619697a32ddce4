"""Branches in a plan (an ONNX If on a run-time condition): the step order a run takes,
the manifest round trip, and every malformed branch a PlanError naming it."""
from __future__ import annotations

import dataclasses
import json

import pytest

import tilefuse
from tilefuse.plan.files import write_manifest
from tests.compiler.if_models import nested_switch_model, sample_rate_model
from tilefuse.errors import PlanError
from tilefuse.plan import BranchStep, KernelStep, SelectStep, load_plan, step_order, verify_plan


def _kernel(name: str) -> KernelStep:
    return KernelStep(name, (), (), 0)


def test_step_order_takes_one_branch_of_each_nested_pair():
    # 0 k0 | 1 branch(c=7) [2 k1, 3 branch(c=8) [4 k2 | 5 k3], 6 select] [7 k4] | 8 select | 9 k5
    steps = [_kernel("k0"), BranchStep(7, 5, 1, 0, "outer"), _kernel("k1"), BranchStep(8, 1, 1, 0, "inner"),
             _kernel("k2"), _kernel("k3"), SelectStep(8, (), (), (), 0, "inner"), _kernel("k4"),
             SelectStep(7, (), (), (), 0, "outer"), _kernel("k5")]
    for truth, want in [({7: True, 8: True}, [0, 1, 2, 3, 4, 6, 8, 9]), ({7: True, 8: False}, [0, 1, 2, 3, 5, 6, 8, 9]),
                        ({7: False, 8: True}, [0, 1, 7, 8, 9])]:
        asked = []

        def test(step, truth=truth):
            asked.append(step.node)
            return truth[step.cond]

        assert list(step_order(steps, test)) == want
        assert asked == (["outer", "inner"] if truth[7] else ["outer"])  # only the branches reached


def test_branch_plan_round_trips(tmp_path):
    plan = tilefuse.compile(nested_switch_model(), "cpu")
    loaded = load_plan(plan.save(tmp_path / "n.tfplan"))
    assert loaded.steps == plan.steps and loaded.buffers == plan.buffers
    assert sum(isinstance(s, BranchStep) for s in loaded.steps) == 2
    assert "2 branch" in str(loaded)


def test_a_nested_branch_must_end_inside_the_branch_around_it():
    plan = tilefuse.compile(nested_switch_model(), "cpu")
    inner = next(i for i, s in enumerate(plan.steps) if isinstance(s, BranchStep) and "inner" in s.node)
    steps = list(plan.steps)
    steps[inner] = dataclasses.replace(steps[inner], else_steps=steps[inner].else_steps + 1)  # into outer's else
    with pytest.raises(PlanError, match=r"branch outer/then_branch/inner/Branch .* end past branch outer/Branch"):
        verify_plan(dataclasses.replace(plan, steps=tuple(steps)))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """steps: 0 eq, 1 branch, 2 matmul (then), 3 mul+tanh (else), 4 select, 5 mul."""
    plan = tilefuse.compile(sample_rate_model(), "cpu")
    assert [type(s).__name__ for s in plan.steps] == ["KernelStep", "BranchStep", "KernelStep", "KernelStep",
                                                      "SelectStep", "KernelStep"]
    return plan.save(tmp_path_factory.mktemp("plan") / "rate.tfplan")


@pytest.mark.parametrize("edit, message", [
    (lambda m: m["steps"][1].update(then_steps=5), r"branch rate_switch/Branch .* end past the plan"),
    (lambda m: m["steps"][1].update(else_steps=0), r"step 3, after both branches, is not a select"),
    (lambda m: m["steps"][1].update(then_steps=-1), r"then_steps: -1 is outside"),
    (lambda m: m["steps"][1].update(outputs=[4]), r"a branch reads its condition only and writes nothing"),
    (lambda m: m["steps"][1].update(inputs=[0]), r"the condition, buffer 0, is float32\[1,16,32\], not one bool"),
    (lambda m: m["steps"][4].update(inputs=[2, 4]), r"a select of 1 outputs reads 1 \+ 2 x 1 buffers, got 2"),
    (lambda m: m["steps"][4]["inputs"].__setitem__(2, 1), r"select .* output 0 is float32\[1,16,32\], but the branches "
                                                          r"give float32\[1,16,32\] and int64\[\]"),
    (lambda m: m["steps"][1].pop("else_steps"), r"missing field 'else_steps'"),
])
def test_malformed_branches_are_plan_errors(saved, tmp_path, edit, message):
    copy = tmp_path / "rate.tfplan"
    copy.mkdir()
    for f in saved.rglob("*"):
        if f.is_file():
            (copy / f.relative_to(saved)).parent.mkdir(parents=True, exist_ok=True)
            (copy / f.relative_to(saved)).write_bytes(f.read_bytes())
    m = json.loads((copy / "manifest.json").read_text())
    edit(m)
    write_manifest(copy, m)
    with pytest.raises(PlanError, match=message):
        load_plan(copy)
