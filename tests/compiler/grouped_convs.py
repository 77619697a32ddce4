"""Grouped convolutions (1 < groups, not depthwise: ResNeXt, RegNet, ShuffleNet) for the
tests of their implicit-GEMM schedule (tile_ir/lower/gemm_epilogue.py) at each stage: the
CPU pipeline, the tile interpreter on the CPU's and cuda:sm_90a's programs, CUDA builds.

Each case is one Conv with a bias and a ReLU (the epilogue), at shapes that reach each
path of the schedule: groups 2 to 32, 1 to 16 input channels and 1 to 16 output channels
a group (a column tile lies inside one group, so it divides those), strides, dilations,
one-sided and SAME padding, 1-D and 2-D, few and many positions per image (the CPU's
positions-as-rows and channels-as-rows tiles), K tiles padded to the MMA's k16 (GPU).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

CASES: dict[str, tuple[tuple[int, ...], int, dict]] = {
    # name: (x shape, output channels, Conv attributes); (cin / group, cout / group) in the comment
    "g2_same_upper_stride2": ((2, 4, 9, 9), 8, dict(group=2, kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")),  # 2, 4
    "g2_cin16": ((2, 32, 12, 12), 24, dict(group=2, kernel_shape=[3, 3], pads=[1, 1, 1, 1])),  # 16, 12
    "g4_stride2_pads_asym": ((1, 16, 21, 23), 32, dict(group=4, kernel_shape=[3, 3], strides=[2, 2], pads=[0, 2, 1, 0])),  # 4, 8
    "g8_dilated": ((2, 16, 15, 15), 16, dict(group=8, kernel_shape=[3, 3], dilations=[2, 3], pads=[2, 3, 2, 3])),  # 2, 2
    "g8_1d_dilated": ((2, 32, 40), 64, dict(group=8, kernel_shape=[3], dilations=[2], pads=[2, 2])),  # 4, 8
    "g4_1d_stride2_long": ((2, 12, 150), 20, dict(group=4, kernel_shape=[5], strides=[2], pads=[2, 1])),  # 3, 5
    "g32_resnext": ((1, 128, 14, 14), 128, dict(group=32, kernel_shape=[3, 3], pads=[1, 1, 1, 1])),  # 4, 4
    "g32_two_per_channel": ((2, 32, 10, 10), 64, dict(group=32, kernel_shape=[3, 3], pads=[1, 1, 1, 1])),  # 1, 2
    "g8_one_output_channel": ((1, 16, 12, 12), 8, dict(group=8, kernel_shape=[3, 3], pads=[1, 1, 1, 1])),  # 2, 1
    "g4_pointwise": ((2, 32, 8, 8), 64, dict(group=4, kernel_shape=[1, 1])),  # 8, 16
    "g16_regnet": ((1, 128, 14, 14), 256, dict(group=16, kernel_shape=[3, 3], pads=[1, 1, 1, 1])),  # 8, 16
}


def model(names: list[str], seed: int, dtype=np.float32) -> onnx.ModelProto:
    """One model of the named cases side by side: input ``x_<name>`` -> Conv (+ bias) ->
    Relu -> output ``y_<name>`` (one compile for many kernels)."""
    rng = np.random.default_rng(seed)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes, inputs, outputs, inits = [], [], [], []
    for name in names:
        x_shape, cout, attrs = CASES[name]
        w = (rng.standard_normal((cout, x_shape[1] // attrs["group"], *attrs["kernel_shape"])) * 0.3).astype(dtype)
        b = (rng.standard_normal(cout) * 0.1).astype(dtype)
        inits += [onnx.numpy_helper.from_array(w, f"w_{name}"), onnx.numpy_helper.from_array(b, f"b_{name}")]
        nodes += [helper.make_node("Conv", [f"x_{name}", f"w_{name}", f"b_{name}"], [f"c_{name}"], **attrs),
                  helper.make_node("Relu", [f"c_{name}"], [f"y_{name}"])]
        inputs.append(helper.make_tensor_value_info(f"x_{name}", elem, list(x_shape)))
        outputs.append(helper.make_tensor_value_info(f"y_{name}", elem, [None] * len(x_shape)))
    graph = helper.make_graph(nodes, "grouped_convs", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def feeds(names: list[str], seed: int, dtype=np.float32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"x_{n}": rng.standard_normal(CASES[n][0]).astype(dtype) for n in names}
