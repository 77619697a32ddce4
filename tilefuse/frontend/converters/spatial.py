"""Window geometry shared by the convolution and pooling converters.

ONNX describes sliding windows with ``strides``, ``dilations``, explicit ``pads``
(all begins, then all ends) or ``auto_pad``, and for pooling ``ceil_mode``. These
helpers turn that into the explicit, non-negative pads the Conv and WindowReduce
primitives take.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from tilefuse.frontend.context import NodeContext

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


@dataclass(frozen=True)
class Window:
    """Strides, dilations and (begin..., end...) pads of a window over ``k`` spatial dims."""

    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]


def span(kernel: int, dilation: int) -> int:
    """How many input positions one dilated window covers."""
    return (kernel - 1) * dilation + 1


def split_total(total: int, upper: bool) -> tuple[int, int]:
    """Split ``total`` padding into (begin, end); SAME_UPPER puts the odd one at the end."""
    small = total // 2
    return (small, total - small) if upper else (total - small, small)


def same_pads(sizes: Sequence[int], kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int], upper: bool) -> tuple[int, ...]:
    """auto_pad SAME_*: pad so that ``out = ceil(in / stride)``."""
    begins, ends = [], []
    for n, kk, s, d in zip(sizes, kernel, strides, dilations):
        out = math.ceil(n / s)
        total = max(0, (out - 1) * s + span(kk, d) - n)
        b, e = split_total(total, upper)
        begins.append(b)
        ends.append(e)
    return tuple(begins + ends)


def _ints(ctx: NodeContext, name: str, k: int, default: int) -> tuple[int, ...]:
    value = ctx.attr(name)
    if not value:
        return (default,) * k
    if len(value) != k:
        raise ctx.error(f"{name} has {len(value)} values, expected {k}")
    return tuple(int(v) for v in value)


def window(ctx: NodeContext, sizes: Sequence[int], kernel: Sequence[int]) -> Window:
    """Strides, dilations and pads from a Conv or pooling node's attributes."""
    k = len(kernel)
    strides = _ints(ctx, "strides", k, 1)
    dilations = _ints(ctx, "dilations", k, 1)
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    if auto_pad not in AUTO_PADS:
        raise ctx.unsupported(f"auto_pad={auto_pad!r}")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        pads = same_pads(sizes, kernel, strides, dilations, auto_pad == "SAME_UPPER")
    elif auto_pad == "VALID":
        pads = (0,) * (2 * k)
    else:
        pads = _ints(ctx, "pads", 2 * k, 0)
        if min(pads, default=0) < 0:
            raise ctx.error(f"negative pads {list(pads)}")
    return Window(strides, dilations, pads)


def ceil_extra(sizes: Sequence[int], kernel: Sequence[int], w: Window) -> tuple[int, ...]:
    """Extra end padding that makes a floor-mode window count equal ceil mode's.

    Ceil mode adds a last, partial window, but only if it starts inside the input or
    its begin padding (the rule ONNX Runtime and PyTorch share).
    """
    k = len(kernel)
    extra = []
    for i, (n, kk) in enumerate(zip(sizes, kernel)):
        s, d = w.strides[i], w.dilations[i]
        padded = n + w.pads[i] + w.pads[i + k]
        out = max(0, -(-(padded - span(kk, d)) // s)) + 1
        if (out - 1) * s >= n + w.pads[i]:
            out -= 1
        extra.append(max(0, (out - 1) * s + span(kk, d) - padded))
    return tuple(extra)


def with_end_padding(w: Window, extra: Sequence[int]) -> Window:
    k = len(extra)
    pads = w.pads[:k] + tuple(p + e for p, e in zip(w.pads[k:], extra))
    return Window(w.strides, w.dilations, pads)
