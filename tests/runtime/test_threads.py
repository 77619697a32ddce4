"""The thread count of a CPU session: ``InferenceSession(plan, threads=N)`` is what its
parallel kernels run with, whichever thread runs it, beside sessions of other counts, and
whatever OMP_NUM_THREADS says; results do not depend on it and match onnxruntime."""
import dataclasses
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import tilefuse
from tilefuse.errors import InputError
from tilefuse.runtime import InferenceSession

from tests.plan.handmade import PROBE_M as M
from tests.plan.handmade import PROBE_N as N
from tests.plan.handmade import default_team, probe_plan, probe_team

ROOT = Path(__file__).resolve().parents[2]


def _feeds(seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((M, N)).astype(np.float32)}


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    return probe_plan(tmp_path_factory.mktemp("probe"))


def test_each_session_runs_with_its_own_thread_count(probe):
    _, plan, lib = probe
    one, two, default = InferenceSession(plan, threads=1), InferenceSession(plan, threads=2), InferenceSession(plan)
    assert (one.threads, two.threads, default.threads) == (1, 2, default_team())
    assert InferenceSession(plan, threads=0).threads == default_team()  # 0: the default, as in onnxruntime
    for sess in (one, two, default, two, one, default):  # alternately, on one thread
        sess.run(None, _feeds(0))
        assert probe_team(lib) == sess.threads

    seen = {}

    def other_thread() -> None:  # a thread of its own: the session's count there too
        two.run(None, _feeds(1))
        seen["team"] = probe_team(lib)

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert seen["team"] == 2


def test_a_kernel_built_on_an_openmp_runtime_gets_the_count_too(tmp_path):
    _, plan, lib = probe_plan(tmp_path, pool=False)
    for n in (2, 1, 3):
        sess = InferenceSession(plan, threads=n)
        sess.run(None, _feeds(0))
        assert sess.threads == probe_team(lib) == n and sess._executor.thread_pool == "openmp"


def test_the_count_holds_under_omp_num_threads(probe, tmp_path):
    """``OMP_NUM_THREADS=1`` sets the default, not a session's explicit count (the CLI's
    ``bench --threads 2`` under it used to run one thread and record two)."""
    _, plan, lib = probe
    plan.save(tmp_path / "probe.tfplan")
    script = f"""
import json, numpy as np
from tests.plan.handmade import probe_team
from tilefuse.runtime import InferenceSession
out = {{}}
for n in (2, None):
    sess = InferenceSession({str(tmp_path / 'probe.tfplan')!r}, threads=n)
    sess.run(None, {{"x": np.ones(({M}, {N}), np.float32)}})
    out[str(n)] = [sess.threads, probe_team(sess.plan.kernels[next(iter(sess.plan.kernels))].path)]
print(json.dumps(out))
"""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    assert json.loads(done.stdout) == {"2": [2, 2], "None": [1, 1]}


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_a_bad_thread_count_is_an_input_error(probe, bad):
    _, plan, _ = probe
    with pytest.raises(InputError, match="threads must be a non-negative integer"):
        InferenceSession(plan, threads=bad)


def test_a_gpu_plan_takes_no_thread_count(probe):
    _, plan, _ = probe
    with pytest.raises(InputError, match="do not run on host threads"):
        InferenceSession(dataclasses.replace(plan, target="cuda:sm_90a"), threads=2)


def _product_model(tmp: Path) -> Path:
    """y = relu(x @ w + b): products big enough for parallel kernels."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal((256, 256)).astype(np.float32) / 16, "w"),
             numpy_helper.from_array(rng.standard_normal(256).astype(np.float32), "b"),
             numpy_helper.from_array(rng.standard_normal((256, 128)).astype(np.float32) / 16, "w2")]
    nodes = [h.make_node("MatMul", ["x", "w"], ["xw"]), h.make_node("Add", ["xw", "b"], ["z"]),
             h.make_node("Relu", ["z"], ["r"]), h.make_node("MatMul", ["r", "w2"], ["y"])]
    g = h.make_graph(nodes, "products", [h.make_tensor_value_info("x", T.FLOAT, [128, 256])],
                     [h.make_tensor_value_info("y", T.FLOAT, [128, 128])], initializer=inits)
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp / "products.onnx"
    onnx.save(model, path)
    return path


def test_sessions_of_one_and_two_threads_match_onnxruntime_and_each_other(tmp_path):
    path = _product_model(tmp_path)
    plan = tilefuse.compile(path, "cpu")
    one, two = InferenceSession(plan, threads=1), InferenceSession(plan, threads=2)
    assert two._executor.thread_pool == "tilefuse"  # some kernel has a parallel loop
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    results: dict[int, list[np.ndarray]] = {1: [], 2: []}

    def runs(sess, seeds) -> None:
        for seed in seeds:
            feeds = {"x": np.random.default_rng(seed).standard_normal((128, 256)).astype(np.float32)}
            results[sess.threads].append(sess.run(None, feeds)[0])

    runs(one, [0, 1]), runs(two, [0, 1])  # one thread, then the other
    both = [threading.Thread(target=runs, args=(s, [2, 3])) for s in (one, two)]  # at once
    for t in both:
        t.start()
    for t in both:
        t.join()
    for k, seed in enumerate([0, 1, 2, 3]):
        feeds = {"x": np.random.default_rng(seed).standard_normal((128, 256)).astype(np.float32)}
        (want,) = ref.run(None, feeds)
        np.testing.assert_allclose(results[1][k], want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
        np.testing.assert_array_equal(results[1][k], results[2][k])  # each element summed the same way
