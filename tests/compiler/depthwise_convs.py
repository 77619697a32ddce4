"""Depthwise convolutions (MobileNetV2, EfficientNet) for the tests of their CPU schedules
(tile_ir/lower/conv_rows.py): from zero-padded input rows on chip, split by stride phase,
every tap summed per position along them (``depthwise_padded``); with 16 channels in vector
lanes (``depthwise_lanes_tile``); strided ones over wide rows summed over the input planes
where they lie (``depthwise_planes_tile``).

Each case is one depthwise Conv with a bias (a folded BatchNorm) and the epilogue the
models put after it, at shapes none of the models has as well as theirs: 3 x 3 and 5 x 5,
stride 1, 2 and 3, dilation, one-sided and no padding, 8 to 1152 channels, maps of 7 x 7 to
112 x 112 and odd widths (13, 29, 75, 81), batch 1 to 3.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from tilefuse import cpu_isa

CASES: dict[str, tuple[tuple[int, ...], dict, str]] = {
    # name: (x shape, Conv attributes, epilogue: relu6 | silu | clip | residual)
    "k3_s1_112": ((1, 32, 112, 112), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), "relu6"),
    "k3_s1_56_b3": ((3, 16, 56, 56), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), "relu6"),
    "k5_s1_7_1152": ((1, 1152, 7, 7), dict(kernel_shape=[5, 5], pads=[2, 2, 2, 2]), "silu"),
    "k5_s1_14_b3": ((3, 40, 14, 14), dict(kernel_shape=[5, 5], pads=[2, 2, 2, 2]), "silu"),
    "k3_s1_odd13": ((1, 24, 13, 13), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), "residual"),
    "k5_s1_odd29_asym": ((3, 8, 29, 29), dict(kernel_shape=[5, 5], pads=[1, 2, 3, 0]), "clip"),
    "k3_s1_dilated": ((1, 48, 29, 13), dict(kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 2, 2, 2]), "relu6"),
    "k3_s1_nopad": ((3, 16, 15, 17), dict(kernel_shape=[3, 3]), "silu"),
    "k3_s1_28_rows": ((1, 192, 28, 28), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), "residual"),
    "k3_s2_112": ((1, 96, 112, 112), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), "relu6"),
    "k5_s2_odd29": ((3, 24, 29, 29), dict(kernel_shape=[5, 5], strides=[2, 2], pads=[2, 2, 2, 2]), "silu"),
    "k3_s2_14": ((1, 576, 14, 14), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 1, 1]), "clip"),
    # strided with asymmetric pads on odd maps, batch 2; dilated with asymmetric pads
    "k5_s2_asym_b2": ((2, 32, 15, 13), dict(kernel_shape=[5, 5], strides=[2, 2], pads=[2, 1, 1, 2]), "silu"),
    "k3_d2_asym": ((1, 16, 23, 11), dict(kernel_shape=[3, 3], dilations=[2, 2], pads=[1, 3, 3, 1]), "residual"),
    # channels in lanes (5 x 5 or strided on rows under 32 wide): dilated with asymmetric
    # pads; a map of two row tiles (the rows above and below the input found per tile)
    "k5_d2_lanes": ((1, 16, 17, 19), dict(kernel_shape=[5, 5], dilations=[2, 2], pads=[4, 3, 4, 5]), "clip"),
    "k5_lanes_tall": ((1, 16, 40, 10), dict(kernel_shape=[5, 5], pads=[2, 2, 2, 2]), "relu6"),
    # rows of at most 8 (half a 16-float vector): in lanes unstrided 3 x 3 too, where the
    # epilogue reads one value a channel (not a residual); a residual's in lanes at 5 x 5,
    # its epilogue over channel rows
    "k3_s1_7_lanes": ((1, 960, 7, 7), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), "relu6"),
    "k3_s1_8_residual": ((2, 32, 8, 8), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), "residual"),
    "k5_s1_9_residual": ((2, 16, 9, 9), dict(kernel_shape=[5, 5], pads=[2, 2, 2, 2]), "residual"),
    # strided over rows 32 wide or more: summed over the input planes where they lie (the
    # CPU's ConvPolicy.depthwise_planes), with asymmetric pads, dilation, stride 3, batch 2
    "k5_s2_planes_asym_b2": ((2, 12, 70, 81), dict(kernel_shape=[5, 5], strides=[2, 2], pads=[2, 1, 1, 2]), "silu"),
    "k3_s2_planes_dilated": ((1, 8, 33, 75), dict(kernel_shape=[3, 3], strides=[2, 2], dilations=[2, 2],
                                                  pads=[2, 2, 2, 2]), "residual_pool"),
    "k3_s3_planes": ((1, 8, 20, 100), dict(kernel_shape=[3, 3], strides=[3, 3], pads=[1, 1, 1, 1]), "relu6"),
}


def out_width(name: str) -> int:
    shape, attrs, _ = CASES[name]
    pads, k = attrs.get("pads", [0, 0, 0, 0]), attrs["kernel_shape"][1]
    span = (k - 1) * attrs.get("dilations", [1, 1])[1] + 1
    return (shape[3] + pads[1] + pads[3] - span) // attrs.get("strides", [1, 1])[1] + 1


def in_lanes(name: str) -> bool:
    """Whether case ``name``'s rows are under 32 wide, its channels a multiple of 16 and it
    is strided, of 25 taps or more, or of rows at most 8 wide whose epilogue stays in the
    lanes (what ``ConvPolicy.depthwise_lanes`` computes in lanes on the CPU)."""
    shape, attrs, _ = CASES[name]
    k = attrs["kernel_shape"]
    return out_width(name) < 32 and shape[1] % 16 == 0 and (attrs.get("strides", [1, 1])[1] > 1 or k[0] * k[1] >= 25
                                                           or (out_width(name) <= 8 and lanes_epilogue(name)))


def lanes_epilogue(name: str) -> bool:
    """Whether case ``name``'s epilogue reads nothing a position but the sums (not a
    residual) and this machine's kernels have AVX-512's block transpose: in lanes, it is
    computed there (``ConvPolicy.lanes_epilogue``)."""
    return CASES[name][2] not in ("residual", "residual_pool") and "avx512f" in cpu_isa.requires("native")


def in_planes(name: str) -> bool:
    """Whether case ``name`` has rows 32 wide or more, or, where this machine's kernels read
    the rows in place (AVX-512), is unstrided and undilated with rows 16 or more and not
    in lanes (what ``ConvPolicy.depthwise_planes`` and ``depthwise_planes_width`` sum over
    the input planes where they lie on the CPU)."""
    attrs = CASES[name][1]
    in_place = (attrs.get("strides", [1, 1]) == [1, 1] and attrs.get("dilations", [1, 1]) == [1, 1]
                and "avx512f" in cpu_isa.requires("native"))
    return out_width(name) >= 32 or (in_place and out_width(name) >= 16 and not in_lanes(name))


def _epilogue(name: str, kind: str) -> list[onnx.NodeProto]:
    c, y = f"c_{name}", f"y_{name}"
    if kind == "relu6":
        return [helper.make_node("Clip", [c, "zero", "six"], [y])]
    if kind == "clip":
        return [helper.make_node("Clip", [c, "lo", "six"], [y])]
    if kind == "silu":
        return [helper.make_node("Sigmoid", [c], [f"s_{name}"]), helper.make_node("Mul", [c, f"s_{name}"], [y])]
    if kind == "residual_pool":  # a strided convolution's residual: another input of its output's shape
        return [helper.make_node("Add", [c, f"r_{name}"], [y])]
    return [helper.make_node("Add", [c, f"x_{name}"], [y])]  # residual: same shape at stride 1


def model(names: list[str], seed: int) -> onnx.ModelProto:
    """One model of the named cases side by side: input ``x_<name>`` -> depthwise Conv (+ bias)
    -> epilogue -> output ``y_<name>``."""
    rng = np.random.default_rng(seed)
    nodes, inputs, outputs = [], [], []
    inits = [onnx.numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("zero", 0), ("six", 6), ("lo", -1.5))]
    for name in names:
        x_shape, attrs, kind = CASES[name]
        ch = x_shape[1]
        w = (rng.standard_normal((ch, 1, *attrs["kernel_shape"])) * 0.4).astype(np.float32)
        b = (rng.standard_normal(ch) * 0.2).astype(np.float32)
        inits += [onnx.numpy_helper.from_array(w, f"w_{name}"), onnx.numpy_helper.from_array(b, f"b_{name}")]
        nodes += [helper.make_node("Conv", [f"x_{name}", f"w_{name}", f"b_{name}"], [f"c_{name}"], group=ch, **attrs),
                  *_epilogue(name, kind)]
        inputs.append(helper.make_tensor_value_info(f"x_{name}", TensorProto.FLOAT, list(x_shape)))
        if kind == "residual_pool":
            inputs.append(helper.make_tensor_value_info(f"r_{name}", TensorProto.FLOAT, list(_out_shape(name))))
        outputs.append(helper.make_tensor_value_info(f"y_{name}", TensorProto.FLOAT, [None] * len(x_shape)))
    graph = helper.make_graph(nodes, "depthwise_convs", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _out_shape(name: str) -> tuple[int, ...]:
    shape, attrs, _ = CASES[name]
    pads, (kh, _) = attrs.get("pads", [0, 0, 0, 0]), attrs["kernel_shape"]
    span = (kh - 1) * attrs.get("dilations", [1, 1])[0] + 1
    height = (shape[2] + pads[0] + pads[2] - span) // attrs.get("strides", [1, 1])[0] + 1
    return (shape[0], shape[1], height, out_width(name))


def feeds(names: list[str], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {f"x_{n}": rng.standard_normal(CASES[n][0]).astype(np.float32) for n in names}
    out.update({f"r_{n}": rng.standard_normal(_out_shape(n)).astype(np.float32) for n in names if CASES[n][2] == "residual_pool"})
    return out
