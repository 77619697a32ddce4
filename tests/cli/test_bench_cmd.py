"""`tilefuse bench` (issue 17, item 2): warm-up, iterations and duration, inputs from files,
the statistics serving people read (median, mean, p90/p95/p99, min/max, runs per second),
against onnxruntime, as JSON."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "examples" / "bert-tiny.onnx"


def _bench(*args):
    return subprocess.run([sys.executable, "-m", "tilefuse", "bench", str(MODEL), "--shape", "batch=2", "--shape",
                           "seq=16", *map(str, args)], capture_output=True, text=True, cwd=REPO, timeout=600)


def test_bench_reports_every_statistic_and_honours_counts(tmp_path):
    ids = tmp_path / "ids.npy"
    np.save(ids, np.random.default_rng(1).integers(0, 100, (2, 16)))
    out = tmp_path / "b.json"
    done = _bench("--warmup", 2, "--iterations", 30, "--duration", 0, "--input", f"input_ids={ids}", "--against",
                  "onnxruntime", "--json", out)
    assert done.returncode == 0, done.stderr
    assert "p95" in done.stdout and "p99" in done.stdout and "runs/s" in done.stdout
    r = json.loads(out.read_text())
    for who in ("tilefuse", "onnxruntime"):
        t = r[who]
        assert t["repeats"] == 30 and t["warmup"] == 2  # duration 0: exactly the iterations asked for
        assert t["min_ms"] <= t["p10_ms"] <= t["median_ms"] <= t["p90_ms"] <= t["p95_ms"] <= t["p99_ms"] <= t["max_ms"]
        assert t["per_second"] > 0 and abs(t["per_second"] - t["repeats"] / t["seconds"]) < 1e-6
    assert r["ratio"] == r["tilefuse_ms"] / r["onnxruntime_ms"]


def test_bench_runs_for_the_duration_asked(tmp_path):
    out = tmp_path / "b.json"
    done = _bench("--iterations", 1, "--duration", 0.3, "--json", out)
    assert done.returncode == 0, done.stderr
    t = json.loads(out.read_text())["tilefuse"]
    assert t["seconds"] >= 0.3 and t["repeats"] > 10  # a 0.2 ms model runs many times in 0.3 s


def test_bench_refuses_bad_counts_and_inputs(tmp_path):
    done = _bench("--iterations", 0)
    assert done.returncode == 2 and "--iterations" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    done = _bench("--input", "input_ids")
    assert done.returncode == 2 and "NAME=FILE.npy" in done.stderr
