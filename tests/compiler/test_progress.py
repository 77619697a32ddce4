"""Compile feedback (issue 17, item 3): every stage begins and ends in order, each group
lowered and each distinct kernel built is one step, kernels from the build cache say so; the
CLI prints plain lines (on stdout: stderr is for errors, one line each) when stderr is not
a terminal."""
from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from tilefuse.compiler import compile_model
from tilefuse.progress import Lines, Progress

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "examples" / "bert-tiny.onnx"


class Recorder(Progress):
    def __init__(self):
        self.events = []

    def begin(self, stage, total=0):
        self.events.append(("begin", stage, total))

    def step(self, stage, cached=False):
        self.events.append(("step", stage, cached))

    def end(self, stage):
        self.events.append(("end", stage))


def test_stages_and_kernels_are_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEFUSE_CACHE", str(tmp_path / "cache"))
    shapes = {"batch": 2, "seq": 16}
    first, second = Recorder(), Recorder()
    compiled = compile_model(str(MODEL), "cpu", shapes, progress=first)
    compile_model(str(MODEL), "cpu", shapes, progress=second)
    stages = [e[1] for e in first.events if e[0] == "begin"]
    assert stages == ["import", "partition", "lower", "build", "link"]
    assert [e[1] for e in first.events if e[0] == "end"] == stages
    groups = len(compiled.lowered)
    kernels = len(compiled.plan.kernels)
    assert ("begin", "lower", groups) in first.events
    built = [e[2] for e in first.events if e[:2] == ("step", "build")]
    assert len(built) == kernels and not any(built)  # an empty cache: every kernel compiled
    assert [e[2] for e in second.events if e[:2] == ("step", "build")] == [True] * kernels
    assert sum(1 for e in first.events if e[:2] == ("step", "lower")) == groups


def test_plain_lines():
    out = io.StringIO()
    lines = Lines(out)
    lines.begin("build", 3)
    for cached in (True, True, False):
        lines.step("build", cached)
    lines.end("build")
    assert out.getvalue().startswith("tilefuse: build ") and out.getvalue().endswith(
        ": 3 kernel(s): 2 from the cache, 1 compiled\n")


def test_the_cli_prints_a_line_per_stage_off_a_terminal(tmp_path):
    done = subprocess.run([sys.executable, "-m", "tilefuse", "optimize", str(MODEL), "--shape", "batch=2", "--shape",
                           "seq=16", "-o", str(tmp_path / "p.tfplan")], capture_output=True, text=True, cwd=REPO,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    stages = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("tilefuse: ")]
    assert stages == ["import", "partition", "lower", "build", "link"] and not done.stderr.strip()
