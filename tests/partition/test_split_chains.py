"""A host's weight chain over few rows is split along its hidden dim, one part a core
(partition/split_chains.py): the rewritten graph computes what the model does (reference
and onnxruntime, fresh random inputs), its chain is one kernel batched by the parts with
one whole-row tile a part, and chains the split would not help are left whole."""
from __future__ import annotations

import random

import numpy as np
import onnxruntime as ort
import pytest

import tilefuse
from tilefuse.compare import compare_output
from tilefuse.frontend import import_onnx
from tilefuse.ir.prims import MatMul, Slice
from tilefuse.partition import partition_graph
from tilefuse.partition.split_chains import split_weight_chains
from tilefuse.reference import run_graph
from tilefuse.target import CPU, CUDA_SM90A
from tilefuse.tile_ir.lower import lower_group

from tests.tile_ir.test_panel_gemm import mlp


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
