"""A host's weight chain over few rows is split along its hidden dim, one part a core
(partition/split_chains.py): the rewritten graph computes what the model does (reference
and onnxruntime, fresh random inputs), its chain is one kernel batched by the parts with
one whole-row tile a part, and chains the split would not help are left whole."""
from __future__ import annotations

import random

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tilefuse
from tilefuse.compare import compare_output
from tilefuse.frontend import import_onnx
from tilefuse.ir.prims import MatMul, Slice
from tilefuse.partition import partition_graph
from tilefuse.partition.split_chains import split_weight_chains
from tilefuse.reference import run_graph
from tilefuse.target import CPU, CUDA_SM90A
from tilefuse.tile_ir.lower import lower_group


def mlp(m: int, d: int, hidden: int, *, lead: tuple[int, ...] = (1,), act: str = "Gelu",
        leak: bool = False) -> onnx.ModelProto:
    """LayerNorm(x + act(x @ W1 + b1) @ W2 + b2); ``leak``: the intermediate is also an
    output (read outside the chain)."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array((rng.standard_normal((d, hidden)) / np.sqrt(d)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal(hidden).astype(np.float32), "b1"),
             numpy_helper.from_array((rng.standard_normal((hidden, d)) / np.sqrt(hidden)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.standard_normal(d).astype(np.float32), "b2"),
             numpy_helper.from_array(rng.standard_normal(d).astype(np.float32), "g"),
             numpy_helper.from_array(rng.standard_normal(d).astype(np.float32), "beta")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node(act, ["hb"], ["a"]),
             helper.make_node("MatMul", ["a", "w2"], ["o"]), helper.make_node("Add", ["o", "b2"], ["ob"]),
             helper.make_node("Add", ["ob", "x"], ["r"]),
             helper.make_node("LayerNormalization", ["r", "g", "beta"], ["y"], axis=-1, epsilon=1e-5)]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*lead, m, d])]
    if leak:
        outputs.append(helper.make_tensor_value_info("a", TensorProto.FLOAT, [*lead, m, hidden]))
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*lead, m, d])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _x(shape: tuple[int, ...]) -> tuple[np.ndarray, int]:
    seed = random.randrange(2**31)
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32), seed


@pytest.mark.parametrize("act", ["Gelu", "Relu"])
def test_the_split_graph_computes_what_the_chain_does(act):
    model = mlp(128, 256, 1024, act=act)
    graph = import_onnx(model)
    split = split_weight_chains(graph, CPU)
    assert len(split) == 1
    products = [n for n in graph.nodes if isinstance(n.op, MatMul)]
    assert [n.inputs[1].type.shape for n in products] == [(2, 256, 512), (2, 512, 256)]
    assert sum(isinstance(n.op, Slice) for n in graph.nodes) == 2
    assert all(n.origin for n in graph.nodes)
    x, seed = _x((1, 128, 256))
    got = run_graph(graph, {"x": x})["y"]
    want = run_graph(import_onnx(model), {"x": x})["y"]
    c = compare_output("y", got, want)
    assert c.ok, f"seed={seed}: {c.problem}"


def test_a_split_chain_is_one_kernel_a_part_of_whole_rows_and_runs_as_onnxruntime():
    model = mlp(128, 256, 1024)
    graph = import_onnx(model)
    programs = [lower_group(g, CPU).program for g in partition_graph(graph, CPU).groups if str(g.kind) != "opaque"]
    (chain,) = [p for p in programs if getattr(p.schedule, "chain", False)]
    assert chain.grid == (2, 1, 1) and chain.schedule.tile_m == 128, (chain.grid, chain.schedule)
    assert len(programs) == 2  # the chain's parts, then their sum with the bias, residual and LayerNorm
    x, seed = _x((1, 128, 256))
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for threads in (1, 2):
        got = tilefuse.InferenceSession(tilefuse.compile(model, target="cpu"), threads=threads).run(None, {"x": x})[0]
        c = compare_output("y", got, want)
        assert c.ok, f"seed={seed} threads={threads}: {c.problem}"


@pytest.mark.parametrize("case, model, target", [
    ("a GPU target", mlp(128, 256, 1024), CUDA_SM90A),
    ("more rows than one whole-row tile holds", mlp(600, 256, 1024), CPU),
    ("weights that stay in a core's cache", mlp(128, 64, 256), CPU),
    ("a batch of two sequences", mlp(64, 256, 1024, lead=(2,)), CPU),
    ("parts that are not whole K chunks", mlp(128, 256, 544), CPU),
    ("an intermediate read outside the chain", mlp(128, 256, 1024, leak=True), CPU),
    ("16 rows", mlp(16, 256, 1024), CPU),
])
def test_chains_the_split_would_not_help_are_left_whole(case, model, target):
    graph = import_onnx(model)
    assert split_weight_chains(graph, target) == [], case
    assert [n.inputs[1].type.rank for n in graph.nodes if isinstance(n.op, MatMul)] == [2, 2], case
