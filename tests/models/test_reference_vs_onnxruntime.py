"""Every tiny zoo model, float32 and float16: the reference executor matches onnxruntime.

Inputs are drawn fresh each run (the seed is in the failure message). Tolerances, max
abs error relative to the output's scale: float32 1e-4, float16 1e-2 (tilefuse.compare).
"""
import random

import onnxruntime as ort
import pytest

import models
from tests.ort_int8 import ort_int8_exact
from tilefuse.compare import compare_output
from tilefuse.frontend.qdq import checked_precision
from tilefuse.errors import UnsupportedOpError
from tilefuse.frontend import import_onnx
from tilefuse.reference import run_graph

RUNNABLE = [name for name, spec in models.ZOO.items() if spec.runs_in_ort]
UNSUPPORTED = [name for name, spec in models.ZOO.items() if not spec.runs_in_ort]


def tiny_shapes(name: str) -> dict:
    return models.ZOO[name].shapes("tiny")


@pytest.mark.parametrize("name,dtype", [(n, d) for n in RUNNABLE for d in models.ZOO[n].dtypes])
def test_reference_matches_onnxruntime(name, dtype, zoo_cache):
    path = models.build(name, "tiny", dtype, cache_dir=zoo_cache)
    if checked_precision(path) == "int8" and not ort_int8_exact():
        pytest.skip("onnxruntime's u8 x s8 kernels saturate without VNNI: no oracle on this host (tests/ort_int8.py)")
    shapes = tiny_shapes(name)
    seed = random.randrange(2**31)
    feeds = models.random_inputs(path, shapes, seed=seed)
    graph = import_onnx(path, shapes)
    got = run_graph(graph, feeds)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    want = dict(zip(names, session.run(None, feeds)))
    assert set(got) == set(want)
    for out in names:
        c = compare_output(out, got[out], want[out], precision=checked_precision(path))
        assert c.ok, f"{name} {dtype} seed={seed}: {out}: {c.problem}"


@pytest.mark.parametrize("name", UNSUPPORTED)
def test_unsupported_model_names_its_ops(name, zoo_cache):
    path = models.build(name, "tiny", "float32", cache_dir=zoo_cache)
    with pytest.raises(UnsupportedOpError) as info:
        import_onnx(path, tiny_shapes(name))
    assert info.value.ops and all(op.nodes for op in info.value.ops)


@pytest.mark.parametrize("name", list(models.ZOO))
def test_inspect_works_on_every_zoo_model(name, zoo_cache, capsys):
    from tilefuse.cli.main import main

    path = models.build(name, "tiny", "float32", cache_dir=zoo_cache)
    args = ["inspect", str(path)]
    for key, shape in tiny_shapes(name).items():
        args += ["--shape", f"{key}={','.join(map(str, shape))}"]
    code = main(args)
    captured = capsys.readouterr()
    if models.ZOO[name].runs_in_ort:
        assert code == 0, captured.err
        assert "FLOPs:" in captured.out and "unsupported ops: none" in captured.out
    else:
        assert code == 2 and "unsupported op" in captured.err
