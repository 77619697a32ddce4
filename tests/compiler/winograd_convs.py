"""3 x 3 convolutions for the tests of their CPU schedule by minimal filtering
(tile_ir/lower/conv_winograd.py, the ``Winograd`` statement).

Each case is one ungrouped Conv with a bias (a folded BatchNorm) and the epilogue a model
puts after it, at shapes none of the models has as well as ResNet's: maps whose sides are
not multiples of the 4 x 4 tiles (13 x 17, 20 x 23), no, one-sided and wide padding, batch 2,
input and output channels from 16 to 96 that the chunks and channel blocks divide in
several ways. Some cases are not for minimal filtering (strided, dilated, grouped, few
channels, a 7 x 7 map of four tiles) and keep their schedules.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

CASES: dict[str, tuple[tuple[int, ...], int, dict, str]] = {
    # name: (x shape, output channels, Conv attributes, epilogue: relu | residual | silu | none)
    "r56_64": ((1, 64, 56, 56), 64, dict(pads=[1, 1, 1, 1]), "relu"),
    "odd_13x17_b2": ((2, 24, 13, 17), 24, dict(pads=[1, 1, 1, 1]), "residual"),
    "asym_20x23": ((1, 16, 20, 23), 40, dict(pads=[0, 1, 2, 1]), "silu"),
    "nopad_18": ((1, 32, 18, 18), 16, dict(), "none"),
    "pad2_12x30": ((1, 16, 12, 30), 48, dict(pads=[2, 2, 2, 2]), "relu"),
    "r28_96": ((1, 48, 28, 28), 96, dict(pads=[1, 1, 1, 1]), "relu"),
    "r14_128_b2": ((2, 128, 14, 14), 128, dict(pads=[1, 1, 1, 1]), "residual"),
    # not for minimal filtering
    "stride2": ((1, 32, 28, 28), 32, dict(pads=[1, 1, 1, 1], strides=[2, 2]), "relu"),
    "dilated": ((1, 32, 21, 21), 32, dict(pads=[2, 2, 2, 2], dilations=[2, 2]), "relu"),
    "grouped": ((1, 32, 20, 20), 32, dict(pads=[1, 1, 1, 1], group=2), "relu"),
    "few_in": ((1, 8, 32, 32), 32, dict(pads=[1, 1, 1, 1]), "relu"),
    "map7": ((1, 64, 7, 7), 64, dict(pads=[1, 1, 1, 1]), "relu"),
}


def winograd(name: str) -> bool:
    """Whether case ``name`` is one minimal filtering takes on the CPU target: unit strides
    and dilations, one group, 16 or more input and output channels, and a block of whole
    output rows dividing the map that holds 16 or more 4 x 4 tiles."""
    shape, cout, attrs, _ = CASES[name]
    if attrs.get("strides", [1, 1]) != [1, 1] or attrs.get("dilations", [1, 1]) != [1, 1] or attrs.get("group", 1) != 1:
        return False
    pads = attrs.get("pads", [0, 0, 0, 0])
    height, width = shape[2] + pads[0] + pads[2] - 2, shape[3] + pads[1] + pads[3] - 2
    return min(shape[1], cout) >= 16 and -(-height // 4) * -(-width // 4) >= 16


def _epilogue(name: str, kind: str) -> list[onnx.NodeProto]:
    c, y = f"c_{name}", f"y_{name}"
    if kind == "relu":
        return [helper.make_node("Relu", [c], [y])]
    if kind == "silu":
        return [helper.make_node("Sigmoid", [c], [f"s_{name}"]), helper.make_node("Mul", [c, f"s_{name}"], [y])]
    if kind == "residual":  # same shape: unit strides, Cout == Cin, padding 1
        return [helper.make_node("Add", [c, f"x_{name}"], [y])]
    return [helper.make_node("Identity", [c], [y])]


def model(names: list[str], seed: int) -> onnx.ModelProto:
    """One model of the named cases side by side: input ``x_<name>`` -> Conv (+ bias) ->
    epilogue -> output ``y_<name>``."""
    rng = np.random.default_rng(seed)
    nodes, inputs, outputs, inits = [], [], [], []
    for name in names:
        x_shape, cout, attrs, kind = CASES[name]
        groups = attrs.get("group", 1)
        w = (rng.standard_normal((cout, x_shape[1] // groups, 3, 3)) / np.sqrt(9 * x_shape[1] / groups)).astype(np.float32)
        b = (rng.standard_normal(cout) * 0.2).astype(np.float32)
        inits += [onnx.numpy_helper.from_array(w, f"w_{name}"), onnx.numpy_helper.from_array(b, f"b_{name}")]
        nodes += [helper.make_node("Conv", [f"x_{name}", f"w_{name}", f"b_{name}"], [f"c_{name}"], kernel_shape=[3, 3], **attrs),
                  *_epilogue(name, kind)]
        inputs.append(helper.make_tensor_value_info(f"x_{name}", TensorProto.FLOAT, list(x_shape)))
        outputs.append(helper.make_tensor_value_info(f"y_{name}", TensorProto.FLOAT, [None] * 4))
    graph = helper.make_graph(nodes, "winograd_convs", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def feeds(names: list[str], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"x_{n}": rng.standard_normal(CASES[n][0]).astype(np.float32) for n in names}
