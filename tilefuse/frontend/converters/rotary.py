"""RotaryEmbedding (RoPE) -> Gather, Slice, Concat, Reshape and Map primitives.

Each head vector's first ``rotary_embedding_dim`` values are rotated as pairs
``(x1, x2) -> (cos x1 - sin x2, sin x1 + cos x2)``; the pairs are the two halves of
that prefix, or neighbouring elements when ``interleaved``. The cos/sin rows come from
the caches, gathered by ``position_ids`` when given. Everything is data movement plus
a handful of Maps, so the whole op fuses with the projection that produces its input.
"""
from __future__ import annotations

from tilefuse.frontend.context import NodeContext
from tilefuse.frontend.converters.reduce import to_compute
from tilefuse.frontend.registry import converter
from tilefuse.ir.builder import Builder
from tilefuse.ir.graph import Value
from tilefuse.ir.prims import Gather
from tilefuse.ir.prims import ScalarFn as F


def _heads_last(ctx: NodeContext, x: Value) -> tuple[Value, int]:
    """``x`` as a rank-4 tensor whose last axis is the head vector, and the axis of
    that layout that holds the sequence: 2 for ``[B, H, S, D]``, 1 for a 3-D input
    ``[B, S, H*D]`` viewed as ``[B, S, H, D]``."""
    if x.type.rank == 4:
        return x, 2
    if x.type.rank != 3:
        raise ctx.error(f"input must be [B, H, S, D] or [B, S, H*D], got {x.type}")
    num_heads = int(ctx.attr("num_heads", 0) or 0)
    batch, seq, hidden = x.type.shape
    if num_heads <= 0 or hidden % num_heads:
        raise ctx.error(f"a 3-D input needs num_heads dividing its hidden size {hidden}, got {num_heads}")
    return ctx.b.reshape(x, (batch, seq, num_heads, hidden // num_heads)), 1


def _cache_rows(ctx: NodeContext, cache: Value, position_ids: Value | None, half: int) -> Value:
    """The ``[B, S, rotary_dim / 2]`` rows of a cos or sin cache."""
    if position_ids is not None:
        if cache.type.rank != 2:
            raise ctx.error(f"with position_ids, a cache must be [max_position, rotary_dim / 2], got {cache.type}")
        cache = ctx.b.emit1(Gather(0), cache, position_ids)
    if cache.type.rank != 3 or cache.type.shape[-1] != half:
        raise ctx.error(f"cache rows must be [B, S, {half}], got {cache.type}")
    return cache


def rotate(b: Builder, x: Value, cos: Value, sin: Value, interleaved: bool) -> Value:
    """Rotate the pairs of ``x``'s last axis (of even length ``2 * h``) by the angles
    whose cosines and sines ``cos`` and ``sin`` hold, broadcast to ``[..., h]``."""
    n = x.type.shape[-1]
    last = x.type.rank - 1
    if interleaved:
        x1, x2 = b.slice(x, last, 0, n, 2), b.slice(x, last, 1, n, 2)
    else:
        x1, x2 = b.slice(x, last, 0, n // 2), b.slice(x, last, n // 2, n)
    real = b.map(F.SUB, b.map(F.MUL, cos, x1), b.map(F.MUL, sin, x2))
    imag = b.map(F.ADD, b.map(F.MUL, sin, x1), b.map(F.MUL, cos, x2))
    if not interleaved:
        return b.concat([real, imag], last)
    pairs = real.type.shape + (1,)
    woven = b.concat([b.reshape(real, pairs), b.reshape(imag, pairs)], last + 1)
    return b.reshape(woven, x.type.shape)


@converter("RotaryEmbedding", since=23)
def rotary_embedding(ctx: NodeContext) -> Value:
    """RoPE on ``[B, H, S, D]`` or ``[B, S, H*D]`` inputs; full or partial
    (``rotary_embedding_dim``), half-split or interleaved pairs, caches indexed by
    ``position_ids`` or already per position. Half floats compute in float32."""
    b, x = ctx.b, ctx.input(0)
    x4, seq_axis = _heads_last(ctx, x)
    head = x4.type.shape[-1]
    dim = int(ctx.attr("rotary_embedding_dim", 0) or 0) or head
    if dim % 2 or dim > head:
        raise ctx.error(f"rotary_embedding_dim {dim} must be even and at most the head size {head}")
    position_ids = ctx.optional_input(3)
    cos = _cache_rows(ctx, ctx.input(1), position_ids, dim // 2)
    sin = _cache_rows(ctx, ctx.input(2), position_ids, dim // 2)
    batch, seq = cos.type.shape[:2]
    if (x4.type.shape[0], x4.type.shape[seq_axis]) != (batch, seq):
        raise ctx.error(f"cache rows [{batch}, {seq}, ...] do not match the input {x.type}")
    # [B, S, h] -> [B, 1, S, h] or [B, S, 1, h], so it broadcasts over the heads.
    rows = (batch, 1, seq, dim // 2) if seq_axis == 2 else (batch, seq, 1, dim // 2)
    cos, sin = (b.reshape(to_compute(b, c), rows) for c in (cos, sin))
    xc = to_compute(b, x4)
    rotated = rotate(b, b.slice(xc, 3, 0, dim), cos, sin, bool(ctx.attr("interleaved", 0)))
    if dim < head:
        rotated = b.concat([rotated, b.slice(xc, 3, dim, head)], 3)
    return b.reshape(b.cast(rotated, x.type.dtype), x.type.shape)
