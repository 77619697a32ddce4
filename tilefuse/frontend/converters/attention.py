"""Attention (opsets 23-25) -> MatMul, Map, Reduce: contraction, softmax, contraction.

The decomposition follows the spec's pattern, which the partitioner recognises as one
flash-style kernel without being told its name::

    scores = (Q * sqrt(scale)) @ (K * sqrt(scale))^T    [softcap: tanh(s / c) * c]
    probs  = softmax(scores + bias)                      [fully masked rows -> 0]
    Y      = probs @ V

``bias`` collects the float or boolean ``attn_mask``, the causal frontier, the sliding
window (opset 25) and the padding from ``nonpad_kv_seqlen`` as additive 0 / -inf terms.
It is a folded constant when it depends on no runtime input. Grouped-query attention
does not repeat K and V: Q is viewed as ``[B, Hkv, rep, Sq, D]`` and the MatMul
broadcasts K and V over ``rep``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tilefuse.frontend.context import NodeContext, onnx_dtype
from tilefuse.frontend.converters.reduce import scalar
from tilefuse.frontend.converters.softmax import softmax_of
from tilefuse.frontend.registry import converter
from tilefuse.ir.builder import Builder
from tilefuse.ir.dtypes import DType
from tilefuse.ir.graph import Value
from tilefuse.ir.prims import Pad, ReduceFn
from tilefuse.ir.prims import ScalarFn as F


@dataclass(frozen=True)
class Geometry:
    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    kv_len: int  # past + new
    past_len: int

    @property
    def rep(self) -> int:
        return self.q_heads // self.kv_heads


def _heads_first(ctx: NodeContext, x: Value, heads_attr: str) -> Value:
    """A 3-D ``[B, S, H * D]`` input as ``[B, H, S, D]``; 4-D inputs pass through."""
    if x.type.rank == 4:
        return x
    if x.type.rank != 3:
        raise ctx.error(f"Q, K and V must be 3-D or 4-D, got {x.type}")
    heads = ctx.attr(heads_attr)
    bsz, seq, hidden = x.type.shape
    if not heads or hidden % heads:
        raise ctx.error(f"{heads_attr}={heads} does not divide the hidden size {hidden}")
    b = ctx.b
    return b.transpose(b.reshape(x, (bsz, seq, heads, hidden // heads)), (0, 2, 1, 3))


def _with_past(ctx: NodeContext, new: Value, past_index: int) -> Value:
    past = ctx.optional_input(past_index)
    return new if past is None else ctx.b.concat([past, new], axis=2)


# -- the additive bias ---------------------------------------------------------------------
def _neg_inf_where_not(b: Builder, allowed: Value, like: Value) -> Value:
    """0 where ``allowed``, -inf elsewhere, in ``like``'s dtype."""
    return b.map(F.WHERE, allowed, scalar(b, 0, like), scalar(b, -np.inf, like))


def _padded_mask(b: Builder, mask: Value, kv_len: int) -> Value:
    """A mask shorter than the keys is extended: False (bool) or -inf (float)."""
    short = kv_len - mask.type.shape[-1]
    if short <= 0:
        return mask
    fill = False if mask.type.dtype is DType.BOOL else -np.inf
    r = mask.type.rank
    return b.emit1(Pad((0,) * (2 * r - 1) + (short,), value=fill), mask)


def _offset_plus_row(b: Builder, g: Geometry, nonpad: Value | None) -> Value:
    """``i + offset`` as int64, ``[Sq, 1]`` or per batch ``[B, 1, Sq, 1]``.

    The offset is the number of keys before the query block: the past length, or
    ``nonpad_kv_seqlen[b] - Sq`` for an external cache, else 0.
    """
    rows = np.arange(g.q_len, dtype=np.int64).reshape(g.q_len, 1)
    if nonpad is None or g.past_len:
        return b.const(rows + g.past_len)
    offset = b.map(F.SUB, b.reshape(b.cast(nonpad, DType.INT64), (g.batch, 1, 1, 1)), b.const(np.int64(g.q_len)))
    return b.map(F.ADD, offset, b.const(rows))


def _causal_allowed(b: Builder, g: Geometry, nonpad: Value | None) -> Value:
    cols = b.const(np.arange(g.kv_len, dtype=np.int64).reshape(1, g.kv_len))
    return b.map(F.LE, cols, _offset_plus_row(b, g, nonpad))


def _window_allowed(b: Builder, g: Geometry, nonpad: Value | None, left: int, right: int) -> Value:
    """``p - left <= j <= p + right`` for query position ``p = i + offset``; -1 is unbounded."""
    cols = b.const(np.arange(g.kv_len, dtype=np.int64).reshape(1, g.kv_len))
    diff = b.map(F.SUB, _offset_plus_row(b, g, nonpad), cols)
    allowed = b.const(True)
    if left >= 0:
        allowed = b.map(F.AND, allowed, b.map(F.LE, diff, b.const(np.int64(left))))
    if right >= 0:
        allowed = b.map(F.AND, allowed, b.map(F.GE, diff, b.const(np.int64(-right))))
    return allowed


def attention_bias(ctx: NodeContext, g: Geometry, like: Value) -> Value | None:
    """The additive bias broadcastable to ``[B, Hq, Sq, Skv]``, or None when there is none."""
    b = ctx.b
    mask, nonpad = ctx.optional_input(3), ctx.optional_input(6)
    terms: list[Value] = []
    if mask is not None:
        mask = _padded_mask(b, mask, g.kv_len)
        terms.append(_neg_inf_where_not(b, mask, like) if mask.type.dtype is DType.BOOL else b.cast(mask, like.type.dtype))
    if ctx.attr("is_causal", 0):
        terms.append(_neg_inf_where_not(b, _causal_allowed(b, g, nonpad), like))
    left, right = ctx.attr("left_window_size", -1), ctx.attr("right_window_size", -1)
    if left >= 0 or right >= 0:
        terms.append(_neg_inf_where_not(b, _window_allowed(b, g, nonpad, left, right), like))
    if nonpad is not None:
        cols = b.const(np.arange(g.kv_len, dtype=np.int64))
        valid = b.map(F.LT, cols, b.reshape(b.cast(nonpad, DType.INT64), (g.batch, 1, 1, 1)))
        terms.append(_neg_inf_where_not(b, valid, like))
    bias: Value | None = None
    for t in terms:
        bias = t if bias is None else b.map(F.ADD, bias, t)
    return bias


def _masked_rows(b: Builder, bias: Value | None) -> Value | None:
    """Rows whose bias is -inf everywhere (no key to attend), or None if there are none."""
    if bias is None:
        return None
    full = b.map(F.EQ, b.reduce(ReduceFn.MAX, bias, (bias.type.rank - 1,), True), scalar(b, -np.inf, bias))
    if full.data is not None and not full.data.any():
        return None
    return full


# -- the converter ----------------------------------------------------------------------------
def _geometry(ctx: NodeContext, q: Value, k: Value, v: Value) -> Geometry:
    past = ctx.optional_input(4)
    if (past is None) != (ctx.optional_input(5) is None):
        raise ctx.error("past_key and past_value must be given together")
    if past is not None and ctx.optional_input(6) is not None:
        raise ctx.error("nonpad_kv_seqlen cannot be combined with past_key/past_value")
    bsz, hq, sq, _ = q.type.shape
    hkv = k.type.shape[1]
    if hkv != v.type.shape[1] or hq % hkv:
        raise ctx.error(f"{hq} query heads cannot share {hkv} key/value heads")
    return Geometry(bsz, hq, hkv, sq, k.type.shape[2], past.type.shape[2] if past is not None else 0)


def _softcap(b: Builder, s: Value, cap: float) -> Value:
    if cap <= 0:
        return s
    return b.map(F.MUL, b.map(F.TANH, b.map(F.DIV, s, scalar(b, cap, s))), scalar(b, cap, s))


@converter("Attention", since=23)
def attention(ctx: NodeContext) -> list[Value]:
    """Outputs Y, present_key, present_value and qk_matmul_output (mode 0/1: after
    softcap, 2: plus bias, 3: the softmax), as the reference computes them."""
    b = ctx.b
    mode = ctx.attr("qk_matmul_output_mode", 0)
    if mode not in (0, 1, 2, 3):
        raise ctx.unsupported(f"qk_matmul_output_mode={mode}")
    q3, k3, v3 = ctx.input(0), ctx.input(1), ctx.input(2)
    q = _heads_first(ctx, q3, "q_num_heads")
    k = _with_past(ctx, _heads_first(ctx, k3, "kv_num_heads"), 4)
    v = _with_past(ctx, _heads_first(ctx, v3, "kv_num_heads"), 5)
    g = _geometry(ctx, q, k, v)
    head = q.type.shape[3]
    scale = ctx.attr("scale")
    root = scalar(b, math.sqrt(1.0 / math.sqrt(head) if scale is None else scale), q)
    qs = b.reshape(b.map(F.MUL, q, root), (g.batch, g.kv_heads, g.rep, g.q_len, head))
    kt = b.reshape(b.transpose(b.map(F.MUL, k, root), (0, 1, 3, 2)), (g.batch, g.kv_heads, 1, head, g.kv_len))
    scores = b.reshape(b.matmul(qs, kt), (g.batch, g.q_heads, g.q_len, g.kv_len))
    scores = _softcap(b, scores, ctx.attr("softcap", 0.0))
    bias = attention_bias(ctx, g, scores)
    biased = scores if bias is None else b.map(F.ADD, scores, bias)

    precision = ctx.attr("softmax_precision")
    wide = onnx_dtype(precision, "softmax_precision") if precision else q.type.dtype.compute
    probs = softmax_of(b, b.cast(biased, wide), (3,))
    masked = _masked_rows(b, bias)
    if masked is not None:
        probs = b.map(F.WHERE, masked, scalar(b, 0, probs), probs)

    pv = b.reshape(b.cast(probs, v.type.dtype), (g.batch, g.kv_heads, g.rep, g.q_len, g.kv_len))
    vv = b.reshape(v, (g.batch, g.kv_heads, 1, g.kv_len, v.type.shape[3]))
    y = b.reshape(b.matmul(pv, vv), (g.batch, g.q_heads, g.q_len, v.type.shape[3]))
    if q3.type.rank == 3:
        y = b.reshape(b.transpose(y, (0, 2, 1, 3)), (g.batch, g.q_len, g.q_heads * v.type.shape[3]))
    qk_out = {0: scores, 1: scores, 2: biased, 3: probs}[mode]
    return [b.cast(y, q.type.dtype), k, v, b.cast(qk_out, q.type.dtype)]
