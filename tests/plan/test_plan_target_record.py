"""A plan records what it was built with (issue 16, item 4): the target's device, policies
and codegen options spelled out, and their fingerprint; a manifest whose two disagree is a
PlanError, and variants of a target (``adjust``) record themselves."""
from __future__ import annotations

import json

import pytest

from tilefuse.compiler import compile_graph
from tilefuse.errors import PlanError, TilefuseError
from tilefuse.plan import load_plan
from tilefuse.plan.files import write_manifest
from tilefuse.target import CPU, CUDA_SM90A, adjust

from tests.plan.handmade import mlp_graph


def test_a_plan_records_its_target_and_a_variant_differs(tmp_path):
    plan = compile_graph(mlp_graph(8, 16, 32), CPU).plan
    saved = load_plan(plan.save(tmp_path / "a.tfplan"))
    assert saved.target_fingerprint == CPU.fingerprint() and len(saved.target_fingerprint) == 64
    assert saved.target_spec["device"]["cores"] == CPU.device.cores
    assert saved.target_spec["codegen"]["parallel_min_work"] == CPU.codegen.parallel_min_work
    assert saved.target_spec["gemm"]["row_tile"] == CPU.gemm.row_tile
    variant = adjust(CPU, codegen__parallel_min_work=1 << 10, gemm__tile=32)
    assert variant.codegen.parallel_min_work == 1 << 10 and variant.gemm.tile == 32 and CPU.gemm.tile == 64
    other = compile_graph(mlp_graph(8, 16, 32), variant).plan
    assert other.target_fingerprint == variant.fingerprint() != CPU.fingerprint()
    assert CUDA_SM90A.fingerprint() != CPU.fingerprint()


def test_a_target_record_that_disagrees_with_itself_is_refused(tmp_path):
    path = compile_graph(mlp_graph(8, 16, 32), CPU).plan.save(tmp_path / "a.tfplan")
    m = json.loads((path / "manifest.json").read_text())
    m["target_spec"]["gemm"]["row_tile"] = 7  # edited without its fingerprint
    write_manifest(path, m)
    with pytest.raises(PlanError, match="target_fingerprint.*is not the sha256 of target_spec"):
        load_plan(path)
    m["target_spec"] = []
    write_manifest(path, m)
    with pytest.raises(PlanError, match="target_spec.*expected an object"):
        load_plan(path)
    del m["target_spec"], m["target_fingerprint"]  # a plan that does not record them loads
    write_manifest(path, m)
    assert load_plan(path).target_fingerprint == ""


def test_adjust_names_what_it_cannot_change():
    with pytest.raises(TilefuseError, match="cannot adjust gemm"):
        adjust(CPU, gemm__no_such_field=1)
