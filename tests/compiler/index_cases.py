"""Models and feeds for index checks, shared by the CPU tests (test_index_checks_cpu.py)
and the GPU check (tools/gpu_index_check.py, which runs where only numpy, onnx and
onnxruntime are installed: this module needs nothing else).

Each case is one index-consuming ONNX op whose data and indices are graph inputs,
followed by a Mul (so that the op is fused into a kernel with arithmetic after it);
``feeds(rng, kind)`` gives inputs whose indices are in range ("valid"), in range with
negative ones ("negative"), or hold one bad value ("bad", returned with it).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "bert-tiny.onnx"  # a 2-layer BERT, vocabulary 100
BERT_SHAPES = {"batch": 2, "seq": 16}
BAD_IDS = [100, 1000, -101, -2**63, 2**40, 100000]
INT64_MIN = -2**63
F, I64, I32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32


def bert_feeds(rng: np.random.Generator, low: int = 0) -> dict[str, np.ndarray]:
    return {"input_ids": rng.integers(low, 100, (2, 16)).astype(np.int64),
            "attention_mask": np.ones((2, 16), np.int64)}


def bert_message(bad: int) -> str:
    return f"index {bad} is outside [-100, 100) in input 'input_ids' (the indices of Gather node 'node_embedding')"


def model(node: onnx.NodeProto, inputs: list[tuple[str, int, list[int]]], out_shape: list[int],
          inits: tuple[onnx.TensorProto, ...] = ()) -> bytes:
    """``node`` (output "r") times 2."""
    two = helper.make_tensor("two", F, [], [2])
    g = helper.make_graph(
        [node, helper.make_node("Mul", ["r", "two"], ["y"], name="twice")], "m",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info("y", F, out_shape)], [two, *inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()


Feeds = Callable[[np.random.Generator, str], tuple[dict[str, np.ndarray], int]]


@dataclass(frozen=True)
class Case:
    name: str
    op: str
    model: bytes
    feeds: Feeds
    extent: int  # the range of the coordinate that gets the bad value
    coordinate: str = ""  # "coordinate j of " for the ND ops

    def message(self, bad: int) -> str:
        return (f"index {bad} is outside [-{self.extent}, {self.extent}) in input 'indices' "
                f"({self.coordinate}the indices of {self.op} node 'the_op')")


def _gather(rng, kind, dtype=np.int64):
    idx = rng.integers(0, 5, (2, 3)) if kind == "valid" else rng.integers(-5, 5, (2, 3))
    if kind == "bad":
        idx[1, 2] = 5
    return {"data": rng.standard_normal((3, 5, 4)).astype(np.float32), "indices": idx.astype(dtype)}, 5


def _gather_elements(rng, kind):
    idx = rng.integers(0, 5, (3, 4)) if kind == "valid" else rng.integers(-5, 5, (3, 4))
    if kind == "bad":
        idx[2, 0] = -6
    return {"data": rng.standard_normal((3, 5)).astype(np.float32), "indices": idx.astype(np.int64)}, -6


def _gather_nd(rng, kind):
    low = 0 if kind == "valid" else 1
    idx = np.stack([rng.integers(-4 * low, 4, (2, 3)), rng.integers(-5 * low, 5, (2, 3))], -1)
    if kind == "bad":
        idx[1, 1, 1] = 2**33
    return {"data": rng.standard_normal((4, 5, 3)).astype(np.float32), "indices": idx.astype(np.int64)}, 2**33


def _scatter_elements(rng, kind):
    idx = np.stack([rng.permutation(5)[:2] for _ in range(3)], 1)  # unique in each column
    if kind != "valid":
        idx = np.where(rng.random(idx.shape) < 0.5, idx - 5, idx)
    if kind == "bad":
        idx[0, 1] = INT64_MIN
    return {"data": rng.standard_normal((5, 3)).astype(np.float32), "indices": idx.astype(np.int64),
            "updates": rng.standard_normal((2, 3)).astype(np.float32)}, INT64_MIN


def _scatter_nd(rng, kind):
    idx = rng.permutation(6)[:4].reshape(4, 1)  # unique
    if kind != "valid":
        idx = np.where(rng.random(idx.shape) < 0.5, idx - 6, idx)
    if kind == "bad":
        idx[3, 0] = 6
    return {"data": rng.standard_normal((6, 3)).astype(np.float32), "indices": idx.astype(np.int64),
            "updates": rng.standard_normal((4, 3)).astype(np.float32)}, 6


def _scatter_elements_node(**attrs):
    return helper.make_node("ScatterElements", ["data", "indices", "updates"], ["r"], name="the_op", axis=0, **attrs)


_SCATTER_INPUTS = [("data", F, [5, 3]), ("indices", I64, [2, 3]), ("updates", F, [2, 3])]

CASES = [
    Case("gather", "Gather",
         model(helper.make_node("Gather", ["data", "indices"], ["r"], name="the_op", axis=1),
               [("data", F, [3, 5, 4]), ("indices", I64, [2, 3])], [3, 2, 3, 4]), _gather, 5),
    Case("gather-int32", "Gather",
         model(helper.make_node("Gather", ["data", "indices"], ["r"], name="the_op", axis=1),
               [("data", F, [3, 5, 4]), ("indices", I32, [2, 3])], [3, 2, 3, 4]),
         lambda rng, kind: _gather(rng, kind, np.int32), 5),
    Case("gather_elements", "GatherElements",
         model(helper.make_node("GatherElements", ["data", "indices"], ["r"], name="the_op", axis=1),
               [("data", F, [3, 5]), ("indices", I64, [3, 4])], [3, 4]), _gather_elements, 5),
    Case("gather_nd", "GatherND",
         model(helper.make_node("GatherND", ["data", "indices"], ["r"], name="the_op"),
               [("data", F, [4, 5, 3]), ("indices", I64, [2, 3, 2])], [2, 3, 3]), _gather_nd, 5, "coordinate 1 of "),
    Case("scatter_elements", "ScatterElements", model(_scatter_elements_node(), _SCATTER_INPUTS, [5, 3]),
         _scatter_elements, 5),
    Case("scatter_elements-add", "ScatterElements", model(_scatter_elements_node(reduction="add"), _SCATTER_INPUTS, [5, 3]),
         _scatter_elements, 5),
    Case("scatter_nd", "ScatterND",
         model(helper.make_node("ScatterND", ["data", "indices", "updates"], ["r"], name="the_op"),
               [("data", F, [6, 3]), ("indices", I64, [4, 1]), ("updates", F, [4, 3])], [6, 3]), _scatter_nd, 6),
]


def one_hot_model() -> bytes:
    """OneHot (depth 6, off -1.5, on 3) on the class axis 1, times 2."""
    depth = helper.make_tensor("depth", I64, [], [6])
    values = helper.make_tensor("values", F, [2], [-1.5, 3.0])
    return model(helper.make_node("OneHot", ["indices", "depth", "values"], ["r"], name="the_op", axis=1),
                 [("indices", I64, [3, 4])], [3, 6, 4], inits=(depth, values))


def one_hot_feeds(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Indices in range, negative ones, and in row 0 four outside [-6, 6): 6, -7, 2**40, INT64_MIN."""
    idx = rng.integers(-6, 6, (3, 4))
    idx[0, :4] = [6, -7, 2**40, INT64_MIN]
    return {"indices": idx.astype(np.int64)}
