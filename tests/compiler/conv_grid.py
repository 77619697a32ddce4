"""Convolution cases for the tile-boundary tests: 1-D and 2-D convolutions of every kind of
padding, stride, dilation and grouping, at output sizes around the tile edges the
schedules use, as ONNX models of several independent convolutions each (one compile for
many kernels).

The edges, from tile_ir/lower: on the CPU a convolution of at least
``ConvPolicy.min_positions`` (64) output positions per image is tiled as blocks of whole
output rows of at most 256 positions (the largest divisor of the row count that fits), so
a 1-D convolution of 257 positions (a prime) runs 257 one-position tiles, of 300 two of
150, of 513 three of 171; below 64 positions the positions-as-rows tiles of up to 64
rows; input channels are split into K tiles of whole channels (256 / taps of them), output
channels into tiles of up to 64. The GPU's tiles are powers of two (32 or 64 rows and
columns) whose last tile is partial.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

PADS = ("zero", "symmetric", "begin", "end", "wide", "SAME_UPPER", "SAME_LOWER", "VALID")
GROUPS = ("1", "2", "depthwise", "depthwise_x2")  # depthwise_x2: two output channels per input channel


@dataclass(frozen=True)
class ConvCase:
    x_shape: tuple[int, ...]
    out_channels: int
    attrs: dict

    @property
    def name(self) -> str:
        a = self.attrs
        pads = a.get("auto_pad") or a.get("pads")
        return (f"x{list(self.x_shape)} co={self.out_channels} k={a['kernel_shape']} s={a['strides']} "
                f"d={a['dilations']} g={a['group']} pads={pads}")


def _pads(kind: str, kernel: list[int]) -> dict:
    r = len(kernel)
    if kind in ("SAME_UPPER", "SAME_LOWER", "VALID"):
        return {"auto_pad": kind}
    begin, end = {
        "zero": ([0] * r, [0] * r),
        "symmetric": ([k // 2 for k in kernel], [k // 2 for k in kernel]),
        "begin": ([k - 1 for k in kernel], [0] * r),  # one-sided: the first positions only
        "end": ([0] * r, [k for k in kernel]),  # one-sided, past the last tap
        "wide": ([k + 1 for k in kernel], [1] * r),  # wider than the kernel: whole windows of padding
    }[kind]
    return {"pads": begin + end}


def _input_size(out: int, kernel: int, stride: int, dilation: int, pad: dict, d: int, rank: int, slack: int) -> int:
    """An input size whose output size is ``out`` (``slack`` < stride extra positions that
    the last window does not reach)."""
    slack %= stride
    if "auto_pad" in pad and pad["auto_pad"] != "VALID":
        return (out - 1) * stride + 1 + slack  # SAME: ceil(in / stride)
    pads = pad.get("pads", [0] * 2 * rank)
    return max(1, (out - 1) * stride + (kernel - 1) * dilation + 1 - pads[d] - pads[rank + d] + slack)


def case(out_size: tuple[int, ...], channels: int, out_channels: int, kernel: int, stride: int, dilation: int,
         pads: str, groups: str, batch: int = 1, slack: int = 0) -> ConvCase:
    """A convolution whose output has ``out_size`` spatially."""
    rank = len(out_size)
    ks = [kernel] * rank
    if pads.startswith("SAME") and kernel == 1:
        ks = [2] * rank  # SAME with a 1-wide kernel pads nothing: an even kernel pads one side
    pad = _pads(pads, ks)
    size = tuple(_input_size(o, k, stride, dilation, pad, d, rank, slack + d) for d, (o, k) in enumerate(zip(out_size, ks)))
    g = {"1": 1, "2": 2, "depthwise": channels, "depthwise_x2": channels}[groups]
    if groups == "2":
        channels, out_channels = 2 * -(-channels // 2), 2 * -(-out_channels // 2)
    if groups == "depthwise":
        out_channels = channels
    if groups == "depthwise_x2":
        out_channels = 2 * channels
    attrs = dict(kernel_shape=ks, strides=[stride] * rank, dilations=[dilation] * rank, group=g, **pad)
    return ConvCase((batch, channels, *size), out_channels, attrs)


def reference_attrs(c: ConvCase) -> dict:
    """The case's attributes for onnxruntime, which refuses auto_pad SAME with dilations:
    there, the explicit pads the ONNX spec gives for it (the extra one at the end for
    SAME_UPPER, at the beginning for SAME_LOWER)."""
    a = dict(c.attrs)
    mode = a.get("auto_pad")
    if mode not in ("SAME_UPPER", "SAME_LOWER") or all(d == 1 for d in a["dilations"]):
        return a
    del a["auto_pad"]
    begin, end = [], []
    for n, k, s, d in zip(c.x_shape[2:], a["kernel_shape"], a["strides"], a["dilations"]):
        total = max(0, (-(-n // s) - 1) * s + (k - 1) * d + 1 - n)
        begin.append(total // 2 if mode == "SAME_UPPER" else total - total // 2)
        end.append(total - begin[-1])
    a["pads"] = begin + end
    return a


def model(cases: list[ConvCase], seed: int, for_reference: bool = False) -> onnx.ModelProto:
    """One independent Conv (with bias) per case: input x<i>, output y<i>."""
    rng = np.random.default_rng(seed)
    nodes, inputs, outputs, inits = [], [], [], []
    for i, c in enumerate(cases):
        cin = c.x_shape[1] // c.attrs["group"]
        w = (rng.standard_normal((c.out_channels, cin, *c.attrs["kernel_shape"])) * 0.5).astype(np.float32)
        b = rng.standard_normal(c.out_channels).astype(np.float32)
        inits += [onnx.numpy_helper.from_array(w, f"w{i}"), onnx.numpy_helper.from_array(b, f"b{i}")]
        attrs = reference_attrs(c) if for_reference else c.attrs
        nodes.append(helper.make_node("Conv", [f"x{i}", f"w{i}", f"b{i}"], [f"y{i}"], **attrs))
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, list(c.x_shape)))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [None] * len(c.x_shape)))
    graph = helper.make_graph(nodes, "convs", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def feeds(cases: list[ConvCase], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"x{i}": rng.standard_normal(c.x_shape).astype(np.float32) for i, c in enumerate(cases)}


# -- the grids ------------------------------------------------------------------------
# Output sizes: below, at and above each CPU tile edge (the 64-position threshold of
# channel-row tiles, the 256-position tile), 2 x 256 + 1 (three tiles), and sizes whose
# largest divisor under 256 is small (300: two tiles of 150); for 2-D, rows of a tile.
LENGTHS_1D = (63, 64, 65, 255, 256, 257, 300, 512, 513)
SIZES_2D = ((7, 9), (8, 8), (16, 16), (17, 16), (33, 8), (2, 255), (3, 256), (2, 257), (5, 31))
STRIDE_DILATION = ((1, 1), (2, 1), (1, 2), (3, 1), (1, 3), (2, 3), (3, 2))
KERNELS = (3, 2, 5, 1, 4)
CHANNELS = ((3, 5), (5, 8), (12, 17), (1, 3), (17, 65), (8, 12), (9, 1))  # (in, out): not multiples of 8 mostly


def _grid(rank: int, full: bool) -> list[ConvCase]:
    """Every padding x grouping, each with sizes, strides, dilations, kernels and channel
    counts taken in turn: a few sizes each, or (``full``) every size, with two
    stride/dilation pairs per size."""
    sizes = LENGTHS_1D if rank == 1 else SIZES_2D
    out = []
    for n, (pads, groups) in enumerate(itertools.product(PADS, GROUPS)):
        picks = [(si, n + 2 * si + j) for si in range(len(sizes)) for j in range(2)] if full else \
            [(n + 4 * j, 3 * n + j) for j in range(3 if rank == 1 else 2)]
        for m, (si, sdi) in enumerate(picks):
            stride, dilation = STRIDE_DILATION[sdi % len(STRIDE_DILATION)]
            cin, cout = CHANNELS[(n + m) % len(CHANNELS)]
            kernel = KERNELS[(n + 2 * m) % len(KERNELS)]
            size = sizes[si % len(sizes)]
            out.append(case((size,) if rank == 1 else size, cin, cout, kernel, stride, dilation, pads, groups,
                            batch=1 + (n + m) % 2, slack=n + m))
    return out


def batches(rank: int, full: bool, per_model: int) -> dict[str, list[ConvCase]]:
    """The grid as models of ``per_model`` convolutions, by name."""
    cases = _grid(rank, full)
    return {f"{rank}d-{'full' if full else 'fast'}-{k // per_model}": cases[k:k + per_model]
            for k in range(0, len(cases), per_model)}
