"""Convolutions through the CPU pipeline against onnxruntime, one case per shape of the
channel-rows and depthwise tile schedules: asymmetric and one-sided pads (the per-tap
split of the last dim), strides, dilations, 1-D and 3-D, few positions per image (the
positions-as-rows fallback), depthwise with and without an epilogue."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import tilefuse
from tilefuse.compare import compare_output
from tilefuse.compiler import compile_model

CASES = {
    # name: (x shape, w shape, attrs)
    "same_upper_even_kernel": ((2, 3, 9, 10), (5, 3, 4, 4), dict(auto_pad="SAME_UPPER")),
    "stride2_pads_asym": ((1, 4, 11, 13), (6, 4, 3, 3), dict(strides=[2, 2], pads=[0, 2, 1, 0])),
    "dilated": ((2, 2, 12, 12), (4, 2, 3, 3), dict(dilations=[2, 2], pads=[2, 1, 2, 1])),
    "wide_kernel_1d": ((2, 3, 40), (7, 3, 7), dict(pads=[3, 3])),
    "wide_kernel_1d_long": ((2, 3, 100), (7, 3, 7), dict(pads=[3, 2])),
    "stride2_pads_asym_wide": ((1, 4, 21, 23), (6, 4, 3, 3), dict(strides=[2, 2], pads=[0, 2, 1, 0])),
    "conv3d": ((1, 2, 4, 5, 6), (3, 2, 3, 3, 3), dict(pads=[1, 1, 1, 1, 1, 1])),
    "few_positions": ((2, 16, 3, 3), (8, 16, 3, 3), dict(pads=[1, 1, 1, 1])),
    "depthwise_stride2": ((2, 8, 9, 9), (8, 1, 3, 3), dict(group=8, strides=[2, 2], pads=[1, 1, 1, 1])),
    "depthwise_same_lower": ((1, 6, 7, 10), (6, 1, 4, 2), dict(group=6, auto_pad="SAME_LOWER")),
    "depthwise_kernel_past_input": ((1, 4, 5, 5), (4, 1, 5, 5), dict(group=4, pads=[4, 4, 4, 4])),
}


def _model(x_shape, w_shape, attrs, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(w_shape).astype(np.float32) * 0.3
    b = rng.standard_normal(w_shape[0]).astype(np.float32) * 0.1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs), helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(
        nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * len(x_shape))],
        [onnx.numpy_helper.from_array(w, "w"), onnx.numpy_helper.from_array(b, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("name", list(CASES))
def test_conv_matches_onnxruntime(name, tmp_path):
    x_shape, w_shape, attrs = CASES[name]
    path = tmp_path / f"{name}.onnx"
    onnx.save(_model(x_shape, w_shape, attrs, seed=len(name)), path)
    session = tilefuse.InferenceSession(compile_model(path, "cpu").plan)
    x = np.random.default_rng(0).standard_normal(x_shape).astype(np.float32)
    (got,) = session.run(None, {"x": x})
    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    c = compare_output("y", got, want)
    assert c.ok, f"{name}: {c.problem}"
