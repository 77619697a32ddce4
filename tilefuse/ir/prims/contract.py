"""Contractions: batched matrix products and convolutions (implicit GEMM later on).

Bias, scaling and activations are not part of these primitives: the frontend emits
them as Maps, and the partitioner fuses them back as prologue and epilogue.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from tilefuse.ir.dtypes import widen_half
from tilefuse.ir.prims.base import Kind, Primitive, check_arity
from tilefuse.ir.prims.reduce import sliding_windows
from tilefuse.ir.types import TensorType, broadcast_shapes, type_of



@dataclass(frozen=True, slots=True)
class MatMul(Primitive):
    """``[..., M, K] x [..., K, N] -> [..., M, N]``; batch dims broadcast; both rank >= 2."""

    kind = Kind.CONTRACT
    arity = 2

    def infer(self, inputs: Sequence[TensorType]) -> tuple[TensorType, ...]:
        check_arity(self, inputs)
        a, b = inputs
        if a.rank < 2 or b.rank < 2:
            raise ValueError(f"matmul operands must have rank >= 2, got {a} and {b}")
        if a.dtype is not b.dtype:
            raise TypeError(f"matmul operand dtypes differ: {a.dtype}, {b.dtype}")
        if a.shape[-1] != b.shape[-2]:
            raise ValueError(f"matmul inner dims differ: {a} x {b}")
        batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
        return (TensorType(a.dtype, batch + (a.shape[-2], b.shape[-1])),)

    def evaluate(self, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        a, b = inputs
        return (np.matmul(widen_half(a), widen_half(b)).astype(a.dtype, copy=False),)

    def flops(self, inputs: Sequence[TensorType], outputs: Sequence[TensorType]) -> int:
        return 2 * outputs[0].size * inputs[0].shape[-1]


@dataclass(frozen=True, slots=True)
class Conv(Primitive):
    """Grouped, strided, dilated, padded convolution over the trailing spatial dims.

    ``x [N, C, *S]``, ``w [M, C/groups, *K]`` -> ``[N, M, *out]``; pads are
    (begin..., end...) per spatial dim and are zero.
    """

    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]
    groups: int = 1

    kind = Kind.CONTRACT
    arity = 2

    def infer(self, inputs: Sequence[TensorType]) -> tuple[TensorType, ...]:
        check_arity(self, inputs)
        x, w = inputs
        k = x.rank - 2
        if k < 1 or w.rank != x.rank or len(self.strides) != k or len(self.pads) != 2 * k:
            raise ValueError(f"conv: ranks/parameters do not match: x {x}, w {w}")
        if x.dtype is not w.dtype:
            raise TypeError(f"conv operand dtypes differ: {x.dtype}, {w.dtype}")
        if x.shape[1] != w.shape[1] * self.groups or w.shape[0] % self.groups:
            raise ValueError(f"conv: channels do not match groups={self.groups}: x {x}, w {w}")
        out = []
        for i in range(k):
            span = (w.shape[2 + i] - 1) * self.dilations[i] + 1
            n = x.shape[2 + i] + self.pads[i] + self.pads[i + k]
            if n < span:
                raise ValueError(f"conv: kernel larger than padded input on spatial dim {i}")
            out.append((n - span) // self.strides[i] + 1)
        return (TensorType(x.dtype, (x.shape[0], w.shape[0], *out)),)

    def evaluate(self, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        x, w = inputs
        k = x.ndim - 2
        (out_t,) = self.infer([type_of(x), type_of(w)])
        n, c = x.shape[:2]
        m, cg = w.shape[:2]
        g = self.groups
        pad = [(0, 0), (0, 0)] + [(self.pads[i], self.pads[i + k]) for i in range(k)]
        xp = np.pad(widen_half(x), pad)
        win = sliding_windows(xp, w.shape[2:], self.strides, self.dilations)  # N,C,*out,*K
        out_sp = win.shape[2 : 2 + k]
        positions, taps = math.prod(out_sp), math.prod(w.shape[2:])
        win = win.reshape(n, g, cg, positions, taps)
        cols = win.transpose(0, 1, 3, 2, 4).reshape(n, g, positions, cg * taps)
        wm = widen_half(w).reshape(g, m // g, cg * taps)
        y = np.matmul(cols, wm.transpose(0, 2, 1))  # N, g, P, M/g
        y = y.transpose(0, 1, 3, 2).reshape(out_t.shape)
        return (y.astype(x.dtype, copy=False),)

    def flops(self, inputs: Sequence[TensorType], outputs: Sequence[TensorType]) -> int:
        w = inputs[1]
        return 2 * outputs[0].size * math.prod(w.shape[1:])


@dataclass(frozen=True, slots=True)
class ConvTranspose(Primitive):
    """Transposed convolution: ``x [N, C, *S]``, ``w [C, M/groups, *K]`` -> ``[N, M, *out]``.

    ``out = (S - 1) * stride + (K - 1) * dilation + 1 + output_padding - pad_begin - pad_end``.
    """

    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]
    output_padding: tuple[int, ...]
    groups: int = 1

    kind = Kind.CONTRACT
    arity = 2

    def _full(self, x: TensorType, w: TensorType) -> list[int]:
        k = x.rank - 2
        return [
            (x.shape[2 + i] - 1) * self.strides[i]
            + (w.shape[2 + i] - 1) * self.dilations[i]
            + 1
            + self.output_padding[i]
            for i in range(k)
        ]

    def infer(self, inputs: Sequence[TensorType]) -> tuple[TensorType, ...]:
        check_arity(self, inputs)
        x, w = inputs
        k = x.rank - 2
        if k < 1 or w.rank != x.rank or len(self.strides) != k or len(self.pads) != 2 * k:
            raise ValueError(f"conv_transpose: ranks/parameters do not match: x {x}, w {w}")
        if x.dtype is not w.dtype:
            raise TypeError(f"conv_transpose operand dtypes differ: {x.dtype}, {w.dtype}")
        if x.shape[1] != w.shape[0] or x.shape[1] % self.groups:
            raise ValueError(f"conv_transpose: channels do not match groups={self.groups}")
        full = self._full(x, w)
        out = [full[i] - self.pads[i] - self.pads[i + k] for i in range(k)]
        if min(out, default=1) < 0:
            raise ValueError("conv_transpose: pads larger than the output")
        return (TensorType(x.dtype, (x.shape[0], w.shape[1] * self.groups, *out)),)

    def evaluate(self, inputs: Sequence[np.ndarray]) -> tuple[np.ndarray, ...]:
        x, w = inputs
        k = x.ndim - 2
        n, c = x.shape[:2]
        g, mg = self.groups, w.shape[1]
        full = self._full(type_of(x), type_of(w))
        xg = widen_half(x).reshape(n, g, c // g, *x.shape[2:])
        wg = widen_half(w).reshape(g, c // g, mg, *w.shape[2:])
        y = np.zeros((n, g, mg, *full), dtype=xg.dtype)
        for tap in itertools.product(*(range(d) for d in w.shape[2:])):
            part = np.einsum("ngc...,gcm->ngm...", xg, wg[(slice(None),) * 3 + tap])
            where = tuple(
                slice(t * self.dilations[i], t * self.dilations[i] + (x.shape[2 + i] - 1) * self.strides[i] + 1, self.strides[i])
                for i, t in enumerate(tap)
            )
            y[(slice(None),) * 3 + where] += part
        y = y.reshape(n, g * mg, *full)
        crop = tuple(slice(self.pads[i], full[i] - self.pads[i + k]) for i in range(k))
        return (y[(slice(None), slice(None)) + crop].astype(x.dtype),)

    def flops(self, inputs: Sequence[TensorType], outputs: Sequence[TensorType]) -> int:
        x, w = inputs
        return 2 * x.size * math.prod(w.shape[1:])

