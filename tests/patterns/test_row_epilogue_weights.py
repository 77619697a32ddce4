"""On a host, a product by a weight of several times a core's cache over rows that make
one whole-row tile a core does not take its row epilogue (a LayerNorm): every core would
walk the whole weight; apart, the product's column tiles split it and the norm is a rows
kernel (patterns/gemm.py ``every_core_reads_the_weights``). Either way the plan computes
what onnxruntime does on fresh random inputs."""
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
from tilefuse.ir.prims import MatMul
from tilefuse.partition import partition_graph
from tilefuse.patterns.gemm import every_core_reads_the_weights
from tilefuse.target import CPU, CUDA_SM90A, adjust

SMALL_CACHE = adjust(CPU, device__onchip_bytes=128 * 1024)  # a 1 MB weight is 8 such caches


def _product_norm(m: int, k: int, n: int) -> onnx.ModelProto:
    """LayerNorm(x @ W + b + r): the attention output of a transformer layer."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "b"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "g"),
             numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "beta")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["pb"]),
             helper.make_node("Add", ["pb", "r"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "g", "beta"], ["y"], axis=-1, epsilon=1e-5)]
    graph = helper.make_graph(nodes, "product_norm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, m, k]),
                               helper.make_tensor_value_info("r", TensorProto.FLOAT, [1, m, n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _kernels(model: onnx.ModelProto, target) -> int:
    return len([g for g in partition_graph(import_onnx(model), target).groups if str(g.kind) != "opaque"])


@pytest.mark.parametrize("m, target, kernels", [
    (128, SMALL_CACHE, 2),  # 1 MB of weight, rows of 128 x 64 floats (32 KB): the norm apart
    (128, CPU, 1),  # the weight within a few caches of 1 MB: one kernel
    (1024, SMALL_CACHE, 1),  # rows that make several tiles a core: each reads the weight anyway
    (128, CUDA_SM90A, 1),  # no host
])
def test_a_big_weight_over_few_rows_leaves_its_norm_to_a_rows_kernel(m, target, kernels):
    k, n = 4096, 64
    model = _product_norm(m, k, n)
    assert _kernels(model, target) == kernels
    (product,) = [n for n in import_onnx(model).nodes if isinstance(n.op, MatMul)]
    assert every_core_reads_the_weights(product, target) == (kernels == 2)
    if target is CUDA_SM90A:
        return
    seed = random.randrange(2**31)
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.standard_normal((1, m, k)).astype(np.float32), "r": rng.standard_normal((1, m, n)).astype(np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = tilefuse.InferenceSession(tilefuse.compile(model, target=target)).run(None, feeds)[0]
    c = compare_output("y", got, want)
    assert c.ok, f"seed={seed}: {c.problem}"
