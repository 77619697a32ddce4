"""Reductions over leading axes to few outputs are split in place on devices with blocks.

A column sum of 4,096 rows to 512 outputs was one windows kernel of 512 GPU threads, each
folding 4,096 terms in order; a time-major mean over 3,000 frames likewise. Now the first
reduced axis is split into parts (``RowsPolicy.split_window_outputs``): a partial kernel of
many outputs, then the total over the parts, both still reading along the kept last axis.
The CPU, short folds and reductions that keep no last axis are left as they were. Checked
through the tile interpreter against onnxruntime on fresh random inputs.
"""
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from tilefuse import patterns
from tilefuse.compare import compare_output
from tilefuse.frontend import import_onnx
from tilefuse.frontend.precision import precision_target, with_precision
from tilefuse.ir.prims import Reduce
from tilefuse.partition import partition_graph
from tilefuse.reference import evaluate_all
from tilefuse.target import CPU, CUDA_SM90A
from tilefuse.tile_ir.lower import lower_group

from tests.tile_ir.interpreted import interpret

# op, input shape, axes, keepdims
CASES = {
    "column-sum": ("ReduceSum", (4096, 512), [0], 0),
    "time-major-mean": ("ReduceMean", (3000, 4, 512), [0], 1),
    "leading-max": ("ReduceMax", (2, 2048, 96), [0, 1], 1),
    "prime-length": ("ReduceSum", (3001, 64), [0], 0),  # no divisor: left whole
    "short-fold": ("ReduceSum", (2, 128, 384), [1], 0),  # a mean pooling's 128 tokens: left whole
}


def reduce_model(op, shape, axes, keepdims) -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    ax = helper.make_tensor("axes", TensorProto.INT64, [len(axes)], axes)
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)
    model = helper.make_model(helper.make_graph([node], op, [x], [y], [ax]), opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model).SerializeToString()


def reductions(graph):
    return [n for n in graph.nodes if isinstance(n.op, Reduce)]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("name", list(CASES))
def test_leading_axis_reductions_split_on_the_gpu(name, precision):
    op, shape, axes, keepdims = CASES[name]
    model = reduce_model(op, shape, axes, keepdims)
    x = np.random.default_rng().standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(model).run(None, {"x": x})[0]
    graph = with_precision(import_onnx(onnx.load_from_string(model), {}), precision)
    target = precision_target(CUDA_SM90A, precision)
    groups = partition_graph(graph, target).groups
    split = name not in ("prime-length", "short-fold")
    assert len(reductions(graph)) == (2 if split else 1), [n.op for n in reductions(graph)]
    values = evaluate_all(graph, {"x": x})
    lanes = []
    for g in groups:
        lowered = lower_group(g, target)
        assert isinstance(g.match, patterns.WindowsMatch), g.match
        lanes.append(math.prod(lowered.program.grid) * lowered.program.threads)
        for v, got in interpret(lowered, values):
            values[id(v)] = got
    if split:  # the partial kernel has as many threads as the policy asks, near enough, or
        # as its parts of at least split_window_terms allow
        outputs = math.prod(d for i, d in enumerate(shape) if i not in axes)
        assert max(lanes) >= min(CUDA_SM90A.rows.split_window_outputs // 2, 32 * outputs), lanes
    got = values[id(graph.outputs["y"])]
    c = compare_output("y", got.astype(np.float32), want, precision=precision)
    assert c.ok, c.describe()


def test_the_cpu_keeps_one_reduction():
    graph = import_onnx(onnx.load_from_string(reduce_model(*CASES["column-sum"])), {})
    partition_graph(graph, CPU)
    assert len(reductions(graph)) == 1
