"""The known-good models every mutation starts from, with the feeds they take.

``lm`` is a tiny language-model block (Gather on token ids, add, LayerNormalization,
MatMul + bias, Tanh, Softmax, ReduceSum); ``topk`` has a host step (TopK) between two
kernels. Both are small enough that a compile costs about a second, and both run in
onnxruntime, which is the reference for every case built from them.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.robustness.cases import TensorSpec

OPSET = 17
VOCAB = 32


def _init(name: str, array: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(array, name)


def lm_model(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    f32 = np.float32
    inits = [
        _init("emb", rng.standard_normal((VOCAB, 16)).astype(f32)),
        _init("gamma", (1 + 0.1 * rng.standard_normal(16)).astype(f32)),
        _init("beta", (0.1 * rng.standard_normal(16)).astype(f32)),
        _init("w", (rng.standard_normal((16, 16)) / 4).astype(f32)),
        _init("bias", (0.1 * rng.standard_normal(16)).astype(f32)),
        _init("axes", np.array([1], np.int64)),
    ]
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["e"], name="gather", axis=0),
        helper.make_node("Add", ["e", "x"], ["h"], name="add"),
        helper.make_node("LayerNormalization", ["h", "gamma", "beta"], ["ln"], name="ln", axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["ln", "w"], ["m"], name="matmul"),
        helper.make_node("Add", ["m", "bias"], ["a"], name="add_bias"),
        helper.make_node("Tanh", ["a"], ["t"], name="tanh"),
        helper.make_node("Softmax", ["t"], ["probs"], name="softmax", axis=-1),
        helper.make_node("ReduceSum", ["ln", "axes"], ["pooled"], name="pool", keepdims=0),
    ]
    graph = helper.make_graph(
        nodes, "lm",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 8]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 16])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [2, 8, 16]),
         helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [2, 16])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)


def topk_model(seed: int = 1) -> onnx.ModelProto:
    """Sigmoid, not Relu, before TopK: Relu's zeros would tie, and ties may break either way."""
    rng = np.random.default_rng(seed)
    inits = [
        _init("w", (rng.standard_normal((12, 10)) / 3).astype(np.float32)),
        _init("b", (0.1 * rng.standard_normal(10)).astype(np.float32)),
        _init("k", np.array([4], np.int64)),
        _init("two", np.array(2.0, np.float32)),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="matmul"),
        helper.make_node("Add", ["m", "b"], ["a"], name="add"),
        helper.make_node("Sigmoid", ["a"], ["s"], name="sigmoid"),
        helper.make_node("TopK", ["s", "k"], ["v", "idx"], name="topk", axis=1),
        helper.make_node("Mul", ["v", "two"], ["y"], name="scale"),
    ]
    graph = helper.make_graph(
        nodes, "topk",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4]),
         helper.make_tensor_value_info("idx", TensorProto.INT64, [4, 4])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)


BUILDERS = {"lm": lm_model, "topk": topk_model}

INPUTS: dict[str, tuple[TensorSpec, ...]] = {
    "lm": (TensorSpec("ids", "int64", (2, 8), 0, VOCAB), TensorSpec("x", "float32", (2, 8, 16))),
    "topk": (TensorSpec("x", "float32", (4, 12)),),
}


def base_bytes(name: str) -> bytes:
    return BUILDERS[name]().SerializeToString()
