"""`tilefuse profile PLAN` and `tilefuse bench --profile` (issue 17, item 2): each kernel's
measured time beside its estimate and roofline floor, identical kernels folded (tiny
BERT's two layers: rows of two calls), the ONNX nodes each covers, a table sorted by
total and the same numbers as JSON, which `optimize --report --profile` shows beside the
estimates. Timings are only checked loosely: they must never make the test flaky."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tilefuse.plan import KernelStep, load_plan
from tilefuse.plan.files import MANIFEST, write_manifest
from tilefuse.profile import load_profile, profile
from tilefuse.runtime import InferenceSession
from tilefuse.report.html import FILTER_JS

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "examples" / "bert-tiny.onnx"
SHAPES = ("--shape", "batch=2", "--shape", "seq=16")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "tilefuse", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=600)


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("profile") / "bert-tiny.tfplan"
    done = _cli("optimize", MODEL, *SHAPES, "-o", out)
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def profiled(plan_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("profile") / "p.json"
    done = _cli("profile", plan_dir, "--warmup", 2, "--iterations", 10, "--json", out)
    assert done.returncode == 0, done.stderr
    return done.stdout, load_profile(out)


def test_every_kernel_appears_folded_with_its_nodes(plan_dir, profiled):
    stdout, prof = profiled
    plan = load_plan(plan_dir)
    launches = [s for s in plan.steps if isinstance(s, KernelStep)]
    rows = prof["rows"]
    assert sum(r["calls"] for r in rows if r["kind"] == "kernel") == len(launches)
    assert {r["name"] for r in rows} == {s.kernel for s in launches}
    assert sum(r["calls"] == 2 for r in rows) >= 4  # each layer's kernels, once per layer
    for r in rows:
        assert r["per_call_ms"] > 0 and r["total_ms"] > 0 and r["onnx_nodes"] and r["onnx_ops"]
        assert r["estimate_ms"] > r["floor_ms"] > 0
        assert r["name"][:40] in stdout and r["covers"] in stdout
    assert [r["total_ms"] for r in rows] == sorted((r["total_ms"] for r in rows), reverse=True)
    assert abs(sum(r["share"] for r in rows) - 1) < 1e-9
    assert abs(sum(r["total_ms"] for r in rows) - prof["total_ms"]) < 1e-9


def test_the_steps_add_up_to_about_a_run(plan_dir, profiled, tmp_path):
    _, prof = profiled
    out = tmp_path / "b.json"
    done = _cli("bench", plan_dir, "--warmup", 2, "--iterations", 20, "--duration", 0, "--json", out)
    assert done.returncode == 0, done.stderr
    bench_ms = json.loads(out.read_text())["tilefuse_ms"]
    assert 0.3 * bench_ms < prof["total_ms"] < 3 * bench_ms


def test_json_round_trips(plan_dir, profiled, tmp_path):
    _, prof = profiled
    again = tmp_path / "again.json"
    again.write_text(json.dumps(prof))
    assert load_profile(again) == prof
    assert prof["target"] == "cpu" and prof["iterations"] == 10 and prof["warmup"] == 2
    assert prof["inputs"] == {"input_ids": [2, 16], "attention_mask": [2, 16]}
    assert len(prof["steps"]) == sum(r["calls"] for r in prof["rows"])


def test_bench_profile_prints_the_same_table(plan_dir, profiled, tmp_path):
    stdout, _ = profiled
    out = tmp_path / "b.json"
    done = _cli("bench", plan_dir, "--warmup", 1, "--iterations", 5, "--duration", 0, "--profile", "--json", out)
    assert done.returncode == 0, done.stderr
    header = next(line for line in stdout.splitlines() if "x floor" in line)
    assert "median" in done.stdout and header in done.stdout
    prof = json.loads(out.read_text())["profile"]
    assert {r["name"] for r in prof["rows"]} == {r["name"] for r in profiled[1]["rows"]}
    for r in prof["rows"]:
        assert r["name"][:40] in done.stdout


def test_report_shows_measured_times(profiled, plan_dir, tmp_path):
    _, prof = profiled
    path = tmp_path / "p.json"
    path.write_text(json.dumps(prof))
    report = tmp_path / "r.html"
    done = _cli("optimize", MODEL, *SHAPES, "--dry-run", "--report", report, "--profile", path)
    assert done.returncode == 0, done.stderr
    html = report.read_text()
    assert "measured time" in html and "measured / est." in html
    for st in prof["steps"]:
        assert f'{st["median_ms"] * 1e3:.2f} us' in html
    # one offline file; its one script is the page's own fixed filter
    assert html.count("<script") == 1 and FILTER_JS in html and "http" not in html.replace("http://www.w3.org", "")
    done = _cli("optimize", MODEL, "--shape", "batch=1", "--shape", "seq=16", "--dry-run", "--report", report,
                "--profile", path)
    assert done.returncode == 2 and "--shape" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_plan_without_facts_profiles_with_dashes(plan_dir, tmp_path):
    old = tmp_path / "old.tfplan"
    load_plan(plan_dir).save(old)
    manifest = json.loads((old / MANIFEST).read_text())
    for step in manifest["steps"]:
        step.pop("facts", None)
    write_manifest(old, manifest)
    with InferenceSession(old) as sess:
        feeds = {"input_ids": np.ones((2, 16), np.int64), "attention_mask": np.ones((2, 16), np.int64)}
        prof = profile(sess, feeds, warmup=0, iterations=2)
    assert all(r.estimate_ms is None and r.floor_ms is None and r.covers == "-" for r in prof.rows)
    assert " - " in prof.table()


def test_host_select_and_branch_steps_are_rows_of_their_own(tmp_path):
    import tilefuse

    from tests.compiler.if_models import sum_switch_model
    from tests.plan.handmade import random_feeds, topk_plan

    graph, plan = topk_plan(tmp_path)
    with InferenceSession(plan) as sess:
        prof = profile(sess, random_feeds(graph), warmup=0, iterations=3)
    host = [r for r in prof.rows if r.kind == "host"]
    assert len(host) == 1 and host[0].name == "host TopK" and host[0].estimate_ms is None
    assert "host TopK" in prof.table()
    plan = tilefuse.compile(sum_switch_model(), "cpu")
    with InferenceSession(plan) as sess:
        prof = profile(sess, {"x": np.ones((2, 3, 8, 8), np.float32)}, warmup=0, iterations=3)
    assert [r.kind for r in prof.rows].count("select") == 1
    assert any(s["in_branch"] for s in prof.as_dict()["steps"])
    assert sum(r.calls for r in prof.rows) == len(prof.steps)


@pytest.mark.parametrize("damage", ["missing", "corrupt", "not a plan"])
def test_bad_plans_are_one_line_errors(plan_dir, tmp_path, damage):
    target = tmp_path / "x.tfplan"
    if damage == "corrupt":
        load_plan(plan_dir).save(target)
        (target / MANIFEST).write_text('{"format_version": ')
    elif damage == "not a plan":
        target.mkdir()
    done = _cli("profile", target)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith("tilefuse: error:")


def test_bad_arguments_are_one_line_errors(plan_dir, tmp_path):
    for args in (("--iterations", 0), ("--input", "input_ids=/nowhere.npy"), ("--json", tmp_path / "no" / "p.json")):
        done = _cli("profile", plan_dir, "--warmup", 0, "--iterations", 1, *args)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, (args, done.stderr)
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    done = _cli("optimize", MODEL, *SHAPES, "--dry-run", "--report", tmp_path / "r.html", "--profile", bad)
    assert done.returncode == 2 and "not a tilefuse profile" in done.stderr
