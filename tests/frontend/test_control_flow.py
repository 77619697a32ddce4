"""ONNX If through the frontend: the branch taken inlined when the condition is known at
compile time (shape arithmetic, an input bound with ``constants=``), else a Branch node
holding both branches, whose reference matches onnxruntime for either condition."""
from __future__ import annotations

import random

import numpy as np
import onnxruntime as ort
import pytest

from tests.compiler.if_models import nested_switch_model, sample_rate_model, shape_switch_model, sum_switch_model
from tilefuse.compare import compare_output
from tilefuse.errors import InputError
from tilefuse.frontend import import_onnx
from tilefuse.frontend.context import NotConstantError
from tilefuse.frontend.precision import with_precision
from tilefuse.ir.control import Branch
from tilefuse.ir.dtypes import DType
from tilefuse.reference import run_graph


def _onnxruntime(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _branches(graph) -> list[Branch]:
    return [n.op for n in graph.nodes if isinstance(n.op, Branch)]


def _check(got, want, seed):
    c = compare_output("y", got, want)
    assert c.ok, f"seed={seed}: {c.problem}"


@pytest.mark.parametrize("offset", [-1.0, 1.0])  # ReduceSum(x) < 0, then > 0
def test_data_dependent_condition_becomes_a_branch(offset):
    model = sum_switch_model()
    graph = import_onnx(model)
    (branch,) = _branches(graph)
    assert {type(n.op).__name__ for n in branch.then_graph.nodes} >= {"Conv"}
    assert {type(n.op).__name__ for n in branch.else_graph.nodes} >= {"MatMul"}
    seed = random.randrange(2**31)
    x = (np.random.default_rng(seed).standard_normal((2, 3, 8, 8)) + offset).astype(np.float32)
    assert (x.sum() > 0) == (offset > 0)
    _check(run_graph(graph, {"x": x})["y"], _onnxruntime(model, {"x": x}), seed)


@pytest.mark.parametrize("rate", [16000, 8000])
def test_scalar_input_condition_both_ways_and_bound(rate):
    model = sample_rate_model()
    graph = import_onnx(model)
    assert [v.name for v in graph.inputs] == ["audio", "sample_rate"] and len(_branches(graph)) == 1
    seed = random.randrange(2**31)
    audio = np.random.default_rng(seed).standard_normal((1, 16, 32)).astype(np.float32)
    want = _onnxruntime(model, {"audio": audio, "sample_rate": np.array(rate, np.int64)})
    _check(run_graph(graph, {"audio": audio, "sample_rate": np.array(rate, np.int64)})["y"], want, seed)
    bound = import_onnx(model, constants={"sample_rate": rate})  # a Python int: cast to the input's int64
    assert [v.name for v in bound.inputs] == ["audio"] and not _branches(bound)
    ops = {type(n.op).__name__ for n in bound.nodes}
    assert ("MatMul" in ops) == (rate == 16000)
    _check(run_graph(bound, {"audio": audio})["y"], want, seed)


def test_condition_from_shape_arithmetic_keeps_the_branch_taken():
    model = shape_switch_model()
    for batch, op in ((2, "MatMul"), (3, "Map")):
        graph = import_onnx(model, {"batch": batch})
        assert not _branches(graph) and [type(n.op).__name__ for n in graph.nodes][0] == op
        x = np.random.default_rng(batch).standard_normal((batch, 8)).astype(np.float32)
        _check(run_graph(graph, {"x": x})["y"], _onnxruntime(model, {"x": x}), batch)


def test_nested_if_reads_the_outermost_values():
    model = nested_switch_model()
    graph = import_onnx(model)
    (outer,) = _branches(graph)
    (inner,) = _branches(outer.then_graph)
    assert [v.name for v in inner.then_graph.inputs] == ["x"]  # x is captured through both levels
    seed = random.randrange(2**31)
    rng = np.random.default_rng(seed)
    for offset in (-1.0, 0.3, 3.0):  # else; then/else; then/then
        x = (rng.standard_normal((4, 8)) * 0.5 + offset).astype(np.float32)
        _check(run_graph(graph, {"x": x})["y"], _onnxruntime(model, {"x": x}), seed)


def test_branches_of_different_shapes_need_the_condition_bound():
    model = sample_rate_model(else_shape=(1, 32, 16))
    with pytest.raises(NotConstantError, match=r"rate_switch.*different output types.*\['sample_rate'\].*--const") as e:
        import_onnx(model)
    assert e.value.graph_inputs == ["sample_rate"] and e.value.node == "rate_switch"
    audio = np.random.default_rng(0).standard_normal((1, 16, 32)).astype(np.float32)
    for rate, shape in ((16000, (1, 16, 32)), (44100, (1, 32, 16))):
        graph = import_onnx(model, constants={"sample_rate": np.array(rate)})
        got = run_graph(graph, {"audio": audio})["y"]
        assert got.shape == shape
        _check(got, _onnxruntime(model, {"audio": audio, "sample_rate": np.array(rate, np.int64)}), rate)


@pytest.mark.parametrize("constants, message", [
    ({"rate": 16000}, r"names \['rate'\], which are not inputs"),
    ({"sample_rate": [16000, 8000]}, r"2 value\(s\) given, the input int64\[\] takes 1"),
    ({"sample_rate": 0.5}, r"0.5 is not exactly representable as int64"),
    ({"sample_rate": "fast"}, r"'fast' cannot be read as int64"),
])
def test_bad_constants_are_input_errors(constants, message):
    with pytest.raises(InputError, match=message):
        import_onnx(sample_rate_model(), constants=constants)


def test_half_precision_runs_each_branch_in_half():
    model = sum_switch_model()
    graph = with_precision(import_onnx(model), "fp16")
    (branch,) = _branches(graph)
    assert any(v.type.dtype is DType.FLOAT16 for n in branch.then_graph.nodes for v in n.outputs)
    seed = random.randrange(2**31)
    for offset in (-1.0, 1.0):
        x = (np.random.default_rng(seed).standard_normal((2, 3, 8, 8)) + offset).astype(np.float32)
        got = run_graph(graph, {"x": x})["y"]
        c = compare_output("y", got, _onnxruntime(model, {"x": x}), tolerance=1e-2)
        assert c.ok, f"seed={seed}: {c.problem}"
