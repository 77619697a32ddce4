"""Every tiny zoo model through the whole CPU pipeline: compile, save, load, run, and
compare with onnxruntime on fresh random inputs (float32: 1e-4 of the output's scale).
A quantized model is compared with the project's reference too, and with onnxruntime
only where its u8 x s8 kernels are exact (tests/ort_int8.py)."""
import random
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest

import models
import tilefuse
from tests.ort_int8 import ort_int8_exact
from tilefuse.compare import compare_output
from tilefuse.compiler import compile_model
from tilefuse.frontend import import_onnx
from tilefuse.frontend.qdq import checked_precision
from tilefuse.reference import run_graph

RUNNABLE = [name for name, spec in models.ZOO.items() if spec.runs_in_ort]


@pytest.mark.parametrize("name", RUNNABLE)
def test_plan_matches_onnxruntime(name, zoo_cache, tmp_path):
    shapes = models.ZOO[name].shapes("tiny")
    path = models.build(name, "tiny", "float32", cache_dir=zoo_cache)
    compiled = compile_model(path, "cpu", shapes)
    plan_dir = compiled.plan.save(tmp_path / f"{name}.tfplan")
    session = tilefuse.InferenceSession(plan_dir)
    seed = random.randrange(2**31)
    feeds = models.random_inputs(path, shapes, seed=seed)
    got = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    peers = {}
    precision = checked_precision(path)
    if precision == "int8":
        peers["the reference"] = run_graph(import_onnx(str(path), shapes=shapes), feeds)
    if precision != "int8" or ort_int8_exact():
        ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        peers["onnxruntime"] = dict(zip([o.name for o in ref.get_outputs()], ref.run(None, feeds)))
    for peer, want in peers.items():
        for out, w in want.items():
            c = compare_output(out, got[out], w, precision=precision)
            assert c.ok, f"{name} seed={seed}: {out} against {peer}: {c.problem}"


def test_cli_optimize_then_run_check_in_fresh_processes(zoo_cache, tmp_path):
    path = models.build("bert-legacy", "tiny", "float32", cache_dir=zoo_cache)
    plan = tmp_path / "b.tfplan"
    shape_args = [a for k, v in models.ZOO["bert-legacy"].shapes("tiny").items() for a in ("--shape", f"{k}={','.join(map(str, v))}")]
    subprocess.run([sys.executable, "-m", "tilefuse", "optimize", str(path), *shape_args, "-o", str(plan)], check=True,
                   capture_output=True)
    run = subprocess.run([sys.executable, "-m", "tilefuse", "run", str(plan), "--random", "--check"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count(" ok") == 2


def test_half_precision_model_runs_from_its_plan(zoo_cache, tmp_path):
    shapes = models.ZOO["bert"].shapes("tiny")
    path = models.build("bert", "tiny", "float16", cache_dir=zoo_cache)
    session = tilefuse.InferenceSession(compile_model(path, "cpu", shapes).plan)
    feeds = models.random_inputs(path, shapes, seed=random.randrange(2**31))
    got = session.run(None, feeds)
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    for g, w in zip(got, want):
        assert g.dtype == np.float16
        c = compare_output("out", g, w)
        assert c.ok, c.problem


def test_deep_elementwise_chain_compiles_and_runs():
    """300 Neg nodes in a chain (found by tests/robustness): compiled, it used to overflow
    the element builder's recursion."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Neg", [f"t{i}"], [f"t{i + 1}"]) for i in range(300)]
    nodes += [helper.make_node("Tanh", ["t300"], ["y"])]
    graph = helper.make_graph(nodes, "deep", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    x = np.random.default_rng().standard_normal((4, 8)).astype(np.float32)
    (y,) = tilefuse.InferenceSession(tilefuse.compile(model)).run(None, {"t0": x})
    np.testing.assert_allclose(y, np.tanh(x), rtol=1e-6, atol=1e-6)
