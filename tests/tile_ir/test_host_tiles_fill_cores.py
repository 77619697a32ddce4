"""On a host every core gets a tile of a kernel with work for several: a convolution with
channels as rows (positions as columns, whole output rows a tile) and a global pool over
a large map used to be one tile, so one thread of two worked (EfficientNet's 14 x 14
projections of 480 and 672 channels to 80 and 112, its squeeze-excite pools over 112 x 112
and 56 x 56). Each case: the CPU program's grid has a tile for every core of the target,
and the compiled plan matches onnxruntime and the reference executor on fresh inputs."""
import math

import numpy as np
import onnx
import pytest
from onnx import helper

from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.target import CPU
from tilefuse.tile_ir import lower_group

from tests.tile_ir.compiled import cpu_plan_matches


def _projection(cin: int, cout: int, hw: int, rng) -> onnx.ModelProto:
    w = (rng.standard_normal((cout, cin, 1, 1)) / math.sqrt(cin)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"])]
    return _model(nodes, (1, cin, hw, hw), (1, cout, hw, hw), [w, b])


def _pool(c: int, hw: int, rng) -> onnx.ModelProto:
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]), helper.make_node("Sigmoid", ["p"], ["y"])]
    return _model(nodes, (1, c, hw, hw), (1, c, 1, 1), [])


def _model(nodes, x_shape, y_shape, weights) -> onnx.ModelProto:
    inits = [onnx.numpy_helper.from_array(a, n) for a, n in zip(weights, ("w", "b"))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, list(y_shape))], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


CASES = {
    "projection_672_to_112_at_14": lambda rng: _projection(672, 112, 14, rng),
    "projection_480_to_80_at_14": lambda rng: _projection(480, 80, 14, rng),
    "projection_odd_rows_13": lambda rng: _projection(96, 48, 13, rng),
    "pool_32_at_112": lambda rng: _pool(32, 112, rng),
    "pool_24_at_56": lambda rng: _pool(24, 56, rng),
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_core_gets_a_tile(name):
    rng = np.random.default_rng()
    model = CASES[name](rng)
    x_shape = tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)
    feeds = {"x": rng.standard_normal(x_shape).astype(np.float32)}
    graph = import_onnx(model, {"x": x_shape})
    (group,) = [g for g in partition_graph(graph, CPU).groups if str(g.kind) != "opaque"]
    program = lower_group(group, CPU).program
    assert math.prod(program.grid) >= CPU.device.cores, (program.grid, program.notes)

    cpu_plan_matches(name, model, graph, feeds)


REDUCTIONS = {
    # name: (op, x shape, axes, keepdims): reductions along the last axis, of 16 terms or more
    "sum_spatial_dropped": ("ReduceSum", (3, 5, 17, 33), [2, 3], 0),
    "max_last_axis_3d": ("ReduceMax", (2, 3, 70), [2], 1),
    "min_channels_and_rows": ("ReduceMin", (2, 4, 6, 48), [1, 3], 1),
    "mean_exactly_16": ("ReduceMean", (4, 7, 16), [2], 0),
    "l2_long_rows": ("ReduceL2", (2, 3, 1000), [2], 1),
}


@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_host_reductions_along_the_last_axis_match(name):
    """Whatever schedule takes them (rows, windows with lanes, a split), reductions along
    the last axis of odd lengths match onnxruntime and the reference."""
    op, x_shape, axes, keep = REDUCTIONS[name]
    rng = np.random.default_rng()
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(x_shape))
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)
    axes_init = onnx.numpy_helper.from_array(np.array(axes, np.int64), "axes")
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=keep)
    model = helper.make_model(helper.make_graph([node], "r", [x], [y], [axes_init]), opset_imports=[helper.make_opsetid("", 18)])
    model = onnx.shape_inference.infer_shapes(model)
    feeds = {"x": (rng.standard_normal(x_shape) + (1.5 if op == "ReduceL2" else 0)).astype(np.float32)}
    cpu_plan_matches(name, model, import_onnx(model, {"x": x_shape}), feeds)
