"""``tilefuse bench`` and ``run`` with ``--threads``: what is recorded is what ran, for
tilefuse and for onnxruntime, whatever OMP_NUM_THREADS says (``bench --threads 2`` under
``OMP_NUM_THREADS=1`` used to time one thread and record two)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import tilefuse
from tilefuse.cli.main import main

from tests.plan.handmade import PROBE_M, PROBE_N, probe_plan

ROOT = Path(__file__).resolve().parents[2]


def _plan(tmp_path: Path) -> Path:
    """A plan with parallel kernels (a 128x256 @ 256x256 product), saved with its model."""
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array(rng.standard_normal((256, 256)).astype(np.float32) / 16, "w")
    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["xw"]), h.make_node("Tanh", ["xw"], ["y"])], "m",
                     [h.make_tensor_value_info("x", T.FLOAT, [128, 256])],
                     [h.make_tensor_value_info("y", T.FLOAT, [128, 256])], initializer=[w])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    plan = tilefuse.compile(tmp_path / "m.onnx", "cpu")
    return plan.save(tmp_path / "m.tfplan")


def _probe_with_model(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The probe plan (its kernel reports the team size it ran with), saved, its kernel
    library, and an ONNX model computing the same for ``--against``."""
    _, plan, lib = probe_plan(tmp_path / "build")
    bias = numpy_helper.from_array(np.asarray(plan.weights["bias"]), "bias")
    g = h.make_graph([h.make_node("Add", ["x", "bias"], ["s"]), h.make_node("Relu", ["s"], ["y"])], "probe",
                     [h.make_tensor_value_info("x", T.FLOAT, [PROBE_M, PROBE_N])],
                     [h.make_tensor_value_info("y", T.FLOAT, [PROBE_M, PROBE_N])], initializer=[bias])
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "probe.onnx")
    return plan.save(tmp_path / "probe.tfplan"), lib, tmp_path / "probe.onnx"


def _bench_probe(tmp_path: Path, *extra: str) -> tuple[dict, int]:
    """``tilefuse bench`` of the probe under OMP_NUM_THREADS=1, in a fresh process: what it
    recorded, and the team size the probe's kernel ran with there."""
    plan, _, model = _probe_with_model(tmp_path)
    out = tmp_path / "bench.json"
    argv = ["bench", str(plan), "--against", "onnxruntime", "--model", str(model), "--repeats", "2", "--warmup", "1",
            "--json", str(out), *extra]
    script = f"""
import sys
from tilefuse.cli.main import main

from tests.plan.handmade import PROBE_M, PROBE_N, probe_plan
from tests.plan.handmade import probe_team
from tilefuse.plan import load_plan
from tilefuse.runtime import session as session_module
kept = []  # the bench's session stays open, so its kernel library can be read after it
_init = session_module.InferenceSession.__init__
session_module.InferenceSession.__init__ = lambda self, *a, **k: (_init(self, *a, **k), kept.append(self))[0]
code = main({argv!r})
(kernel,) = load_plan({str(plan)!r}).kernels.values()
print("ran", probe_team(kernel.path), code)
"""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    _, ran, code = done.stdout.strip().splitlines()[-1].split()
    assert code == "0"
    return json.loads(out.read_text()), int(ran)


def test_bench_records_the_threads_that_ran(tmp_path):
    recorded, ran = _bench_probe(tmp_path, "--threads", "2")  # OMP_NUM_THREADS=1 does not override it
    assert (recorded["threads"], ran, recorded["onnxruntime_threads"]) == (2, 2, 2)
    recorded, ran = _bench_probe(tmp_path)  # the default follows it; onnxruntime gets the same
    assert (recorded["threads"], ran, recorded["onnxruntime_threads"]) == (1, 1, 1)


def test_run_checks_with_a_thread_count(tmp_path, capsys):
    plan = _plan(tmp_path)
    for n in ("1", "2"):
        assert main(["run", str(plan), "--random", "--seed", "0", "--threads", n, "--check"]) == 0
        assert "FAIL" not in capsys.readouterr().out


def test_a_negative_thread_count_is_one_line_and_exit_2(tmp_path, capsys):
    plan = _plan(tmp_path)
    assert main(["bench", str(plan), "--threads", "-2"]) == 2
    assert "--threads expects a non-negative integer" in capsys.readouterr().err
