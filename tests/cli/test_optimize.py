"""`tilefuse optimize --dry-run` as a user runs it."""
import json

import pytest
from pathlib import Path

from tilefuse.cli.main import main
from tilefuse.report.html import FILTER_JS

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "bert-tiny.onnx"


def test_dry_run_summary_json_and_explain(tmp_path, capsys):
    out = tmp_path / "s.json"
    code = main(["optimize", str(EXAMPLE), "--shape", "batch=2", "--shape", "seq=16", "--dry-run",
                 "--target", "cuda:sm_90a", "--summary-json", str(out), "--explain"])
    assert code == 0
    text = capsys.readouterr().out
    assert "99 ONNX nodes" in text and "kernels" in text and "why neighbouring kernels stayed apart" in text
    s = json.loads(out.read_text())
    # 2 layers x 5 (QKV, attention, proj+norm, FFN-up+GELU, FFN-down+norm) + embeddings,
    # mask, pooler: 32 rows are too few row tiles for 132 SMs to chain the MLP
    assert s["kernels"] == len(s["groups"]) == 13 and s["onnx_nodes"] == 99
    assert s["fused_bytes"] < s["unfused_bytes"]
    g = s["groups"][2]
    for key in ("id", "primitives", "onnx_nodes", "anchor_kind", "flops", "bytes_in", "bytes_out",
                "estimated_seconds", "bound"):
        assert key in g
    assert g["bound"] in ("memory", "compute")


def test_without_dry_run_writes_a_plan(tmp_path, capsys):
    plan = tmp_path / "b.tfplan"
    assert main(["optimize", str(EXAMPLE), "--shape", "batch=1", "--shape", "seq=8", "-o", str(plan)]) == 0
    assert (plan / "manifest.json").is_file() and (plan / "weights.safetensors").is_file()
    assert f"plan: {plan}" in capsys.readouterr().out


def test_cuda_plan_builds_without_a_gpu(tmp_path, capsys):
    """TileLang lowers on the host and nvcc builds cubins for sm_90a: no GPU needed."""
    pytest.importorskip("tilelang")
    plan = tmp_path / "c.tfplan"
    code = main(["optimize", str(EXAMPLE), "--shape", "batch=1", "--shape", "seq=8", "--target", "cuda:sm_90a",
                 "-o", str(plan)])
    assert code == 0, capsys.readouterr().err
    manifest = json.loads((plan / "manifest.json").read_text())
    assert manifest["target"] == "cuda:sm_90a"
    kernels = manifest["kernels"]
    assert kernels and all(k["file"].endswith(".cubin") for k in kernels)
    for k in kernels:
        launch = k["launch"]
        assert launch["entry"] == k["symbol"] and len(launch["grid"]) == 3 and len(launch["block"]) == 3
        assert all(a["kind"] in ("pointer", "tensormap") for a in launch["args"])
        assert (plan / k["file"]).read_bytes()[:4] == b"\x7fELF"  # a cubin is an ELF image


def test_unknown_target(capsys):
    assert main(["optimize", str(EXAMPLE), "--dry-run", "--target", "tpu"]) == 2
    assert "unknown target" in capsys.readouterr().err


def test_report_is_one_self_contained_file(tmp_path, capsys):
    report = tmp_path / "r.html"
    assert main(["optimize", str(EXAMPLE), "--shape", "batch=2", "--shape", "seq=16", "--dry-run",
                 "--report", str(report)]) == 0
    html = report.read_text()
    assert html.startswith("<!DOCTYPE html>") or html.lstrip().lower().startswith("<!doctype html>")
    assert "<svg" in html and "http://" not in html and "https://" not in html
    assert html.count("<script") == 1 and FILTER_JS in html  # the page's own fixed filter, nothing else
    assert html.count('id="k') >= 12
