"""ONNX If through the whole CPU pipeline. A condition known only at run time: both
branches compiled into the one plan (a branch step, each branch's kernels, a select), the
plan saved, loaded and run for either condition against onnxruntime. A condition bound at
compile time (``consts=``, ``--const``): only the branch taken is compiled."""
from __future__ import annotations

import random

import numpy as np
import onnxruntime as ort
import pytest

import tilefuse
from tests.compiler.if_models import nested_switch_model, sample_rate_model, sum_switch_model
from tilefuse.compare import compare_output
from tilefuse.plan.model import BranchStep, KernelStep, SelectStep


def _run_both(plan_dir, model, feeds_list, seed):
    session = tilefuse.InferenceSession(plan_dir)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for feeds in feeds_list:
        plan_feeds = {k: v for k, v in feeds.items() if k in {i.name for i in session.get_inputs()}}
        (got,) = session.run(None, plan_feeds)
        c = compare_output("y", got, ref.run(None, feeds)[0])
        assert c.ok, f"seed={seed} feeds {sorted(feeds)}: {c.problem}"


def test_run_time_condition_compiles_both_branches(tmp_path):
    model = sum_switch_model()
    plan = tilefuse.compile(model, "cpu")
    kinds = [type(s).__name__ for s in plan.steps]
    assert kinds.count("BranchStep") == 1 and kinds.count("SelectStep") == 1
    branch = next(s for s in plan.steps if isinstance(s, BranchStep))
    at = plan.steps.index(branch)
    then_kernels = [plan.steps[i].kernel for i in range(at + 1, at + 1 + branch.then_steps)]
    else_kernels = [plan.steps[i].kernel for i in range(at + 1 + branch.then_steps, at + 1 + branch.then_steps
                                                        + branch.else_steps)]
    assert any(k.startswith("conv") for k in then_kernels) and any(k.startswith("matmul") for k in else_kernels)
    assert isinstance(plan.steps[at + 1 + branch.then_steps + branch.else_steps], SelectStep)
    seed = random.randrange(2**31)
    rng = np.random.default_rng(seed)
    feeds = [{"x": (rng.standard_normal((2, 3, 8, 8)) + offset).astype(np.float32)} for offset in (-1.0, 1.0, -1.0)]
    _run_both(plan.save(tmp_path / "s.tfplan"), model, feeds, seed)


def test_scalar_input_condition_and_its_specialisations(tmp_path):
    model = sample_rate_model()
    seed = random.randrange(2**31)
    rng = np.random.default_rng(seed)
    feeds = [{"audio": rng.standard_normal((1, 16, 32)).astype(np.float32), "sample_rate": np.array(r, np.int64)}
             for r in (16000, 8000, 16000)]
    plan = tilefuse.compile(model, "cpu")
    assert [n for n, _ in plan.input_types()] == ["audio", "sample_rate"]
    _run_both(plan.save(tmp_path / "runtime.tfplan"), model, feeds, seed)
    for rate in (16000, 8000):
        bound = tilefuse.compile(model, "cpu", consts={"sample_rate": rate})
        assert [n for n, _ in bound.input_types()] == ["audio"]
        assert all(isinstance(s, KernelStep) for s in bound.steps)
        assert any(s.kernel.startswith("matmul") for s in bound.steps) == (rate == 16000)
        same_rate = [f for f in feeds if int(f["sample_rate"]) == rate]
        _run_both(bound.save(tmp_path / f"{rate}.tfplan"), model, same_rate, seed)


def test_nested_branches_run_the_path_taken(tmp_path):
    model = nested_switch_model()
    plan = tilefuse.compile(model, "cpu")
    assert sum(isinstance(s, BranchStep) for s in plan.steps) == 2
    seed = random.randrange(2**31)
    rng = np.random.default_rng(seed)
    feeds = [{"x": (rng.standard_normal((4, 8)) * 0.5 + offset).astype(np.float32)} for offset in (-1.0, 0.3, 3.0, 0.3)]
    _run_both(plan.save(tmp_path / "n.tfplan"), model, feeds, seed)


def test_half_precision_plan_with_a_branch(tmp_path):
    model = sum_switch_model()
    plan = tilefuse.compile(model, "cpu", precision="fp16")
    session = tilefuse.InferenceSession(plan)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    seed = random.randrange(2**31)
    for offset in (-1.0, 1.0):
        x = (np.random.default_rng(seed).standard_normal((2, 3, 8, 8)) + offset).astype(np.float32)
        c = compare_output("y", session.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], tolerance=1e-2)
        assert c.ok, f"seed={seed}: {c.problem}"


@pytest.mark.slow
def test_torch_cond_export_runs_both_branches(tmp_path):
    """A real export: torch.cond (dynamo exporter) becomes an ONNX If on ReduceSum(x) > 0,
    a Linear + ReLU on one side and a Conv1d * 0.5 on the other."""
    torch = pytest.importorskip("torch")
    from models.export import export_dynamo

    class Switch(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.conv = torch.nn.Conv1d(4, 4, 3, padding=1)

        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda x: torch.relu(self.lin(x)), lambda x: self.conv(x) * 0.5, (x,)) + 1

    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=1, max=8)
    model = export_dynamo(Switch().eval(), (torch.randn(2, 4, 8),), ["x"], ["y"], ({0: batch},))
    assert [n.op_type for n in model.graph.node].count("If") == 1
    plan = tilefuse.compile(model, "cpu", {"batch": 3})
    assert sum(isinstance(s, BranchStep) for s in plan.steps) == 1
    seed = random.randrange(2**31)
    rng = np.random.default_rng(seed)
    feeds = [{"x": (rng.standard_normal((3, 4, 8)) + offset).astype(np.float32)} for offset in (1.0, -1.0)]
    _run_both(plan.save(tmp_path / "cond.tfplan"), model, feeds, seed)
