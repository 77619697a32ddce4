"""Attention, flash-style: two products of activations with a row softmax between them.

Two questions, asked at two times. While groups grow, ``attention_problem`` says whether
a set of primitives can still become one attention kernel: two matrix products of
activations, the second taking the first's row-wise result as its left operand, every
reduction over the score rows, a head small enough to keep on chip. Once the partition
is final, ``match_attention`` says whether a group *is* one: the primitives between the
products are exactly a softmax over the last axis — max, subtract, exp, sum, divide,
casts allowed, or the same without the max (``exp(x) / sum(exp(x))``, as some exporters
write it) — recognised from the primitives, not from names, and what follows the second
product is an epilogue of it (no reduction). The probabilities may pass through
elementwise maps of scalar constants before the second product (a QDQ model's
QuantizeLinear/DequantizeLinear pair: ``probs_map``) where every key of a row fits one key
tile: the map needs the normalised row, which an online softmax only has at its end.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tilefuse.ir.graph import Node, Value
from tilefuse.ir.prims import Kind, Map, MatMul, Reduce, ReduceFn, ScalarFn
from tilefuse.patterns.dataflow import chained, contraction_rows, depends_within, row_signature, through_casts
from tilefuse.patterns.epilogue import Epilogue, match_epilogue
from tilefuse.patterns.refusal import Refusal
from tilefuse.target import Target


@dataclass(frozen=True, slots=True)
class Softmax:
    """``probs = exp(x - max(x)) / sum(exp(x - max(x)))`` over the last axis, or, not
    ``shifted``, ``exp(x) / sum(exp(x))``: the same in exact arithmetic, but it overflows
    where the graph's does, so the kernel computes what the graph says."""

    scores: Value  # x: what the row softmax is taken of
    probs: Value  # the value the second product reads as its left operand
    shifted: bool = True  # x's row max is subtracted before the exp
    # softmax's own quotient where ``probs`` is a map of it (fake quantization), else None
    quotient: Value | None = None


@dataclass(frozen=True, slots=True)
class AttentionMatch:
    """``c1`` computes the scores, ``c2`` multiplies their softmax by the values; the
    epilogue follows ``c2`` (a reshape / transpose of the heads, a cast)."""

    c1: Node
    c2: Node
    softmax: Softmax
    epilogue: Epilogue


def match_softmax(c2: Node, members: set[int]) -> Softmax | Refusal:
    """The row softmax ``c2`` reads as its left operand, casts and maps of scalar
    constants after it allowed."""
    p = through_casts(c2.inputs[0], members)
    while not _softmax_division(p.producer, members) and (up := _scalar_map_operand(p, members)) is not None:
        p = up
    div = p.producer
    if div is None or not isinstance(div.op, Map) or div.op.fn is not ScalarFn.DIV:
        return Refusal("the second product's left operand is not a quotient (softmax's division)")
    if not _softmax_division(div, members):
        return Refusal("softmax's divisor is not a sum")
    e, s = (through_casts(u, members) for u in div.inputs)
    rsum = s.producer
    assert rsum is not None
    if through_casts(rsum.inputs[0], members) is not e:
        return Refusal("softmax's sum is not of its numerator")
    exp = e.producer
    if exp is None or not isinstance(exp.op, Map) or exp.op.fn is not ScalarFn.EXP:
        return Refusal("softmax's numerator is not an exp")
    sub = through_casts(exp.inputs[0], members).producer
    rmax = None
    if sub is not None and isinstance(sub.op, Map) and sub.op.fn is ScalarFn.SUB:
        rmax = through_casts(sub.inputs[1], members).producer
        if rmax is None or not isinstance(rmax.op, Reduce) or rmax.op.fn is not ReduceFn.MAX:
            rmax = None  # exp(a - b) of anything else: an unshifted softmax of a - b
        elif rmax.inputs[0] is not sub.inputs[0]:
            return Refusal("softmax's max is not of the scores it is subtracted from")
    reductions = [n for n in (rsum, rmax) if n is not None]
    x = sub.inputs[0] if rmax is not None else exp.inputs[0]  # type: ignore[union-attr]
    inside = [n for n in members_between(x, rsum, members) if isinstance(n.op, Reduce) and all(n is not r for r in reductions)]
    if inside:
        return Refusal(f"a {inside[0].op.name} inside softmax's argument (not a row max it subtracts)")
    last = x.type.rank - 1
    for r in reductions:
        if r.op.axes != (last,) or not r.op.keepdims:  # type: ignore[attr-defined]
            return Refusal("softmax's reductions are not over the last axis, dims kept")
    mapped = through_casts(c2.inputs[0], members) is not p
    return Softmax(x, c2.inputs[0], shifted=rmax is not None, quotient=div.outputs[0] if mapped else None)


def _softmax_division(n: Node | None, members: set[int]) -> bool:
    """Whether ``n`` divides by a row sum (softmax's division, casts allowed)."""
    if n is None or id(n) not in members or not isinstance(n.op, Map) or n.op.fn is not ScalarFn.DIV:
        return False
    s = through_casts(n.inputs[1], members).producer
    return s is not None and isinstance(s.op, Reduce) and s.op.fn is ReduceFn.SUM


def _scalar_map_operand(v: Value, members: set[int]) -> Value | None:
    """The one tensor operand of the group's elementwise map producing ``v``, where its
    other operands are scalar constants (a fake quantization's divide, round, shift,
    clip, casts); else None."""
    n = v.producer
    if n is None or id(n) not in members or not isinstance(n.op, Map):
        return None
    tensors = [u for u in n.inputs if not (u.is_constant and u.type.size == 1)]
    if len(tensors) != 1 or tensors[0].type.shape != v.type.shape:
        return None
    return tensors[0]


def members_between(x: Value, end: Node, members: set[int]) -> list[Node]:
    """The group's nodes that ``x`` is computed from: the producers above it inside the
    group (what the kernel computes elementwise from the first product's scores)."""
    seen: dict[int, Node] = {}
    stack = [x]
    while stack:
        v = stack.pop()
        n = v.producer
        if n is None or id(n) not in members or id(n) in seen or n is end:
            continue
        seen[id(n)] = n
        stack.extend(n.inputs)
    return list(seen.values())


def match_attention(nodes: Sequence[Node], outputs: Sequence[Value], target: Target) -> AttentionMatch | Refusal:
    """The group as one flash-style kernel, or why not."""
    contractions = [n for n in nodes if n.op.kind is Kind.CONTRACT]
    if len(contractions) != 2 or not all(isinstance(c.op, MatMul) for c in contractions):
        return Refusal("not two matrix products")
    c1, c2 = contractions
    members = {id(n) for n in nodes}
    sm = match_softmax(c2, members)
    if isinstance(sm, Refusal):
        return sm
    if sm.scores.type.shape != c1.outputs[0].type.shape:
        return Refusal("the softmax is not of the first product's scores")
    after = list(nodes)[list(nodes).index(c2) + 1:]
    epilogue = match_epilogue(after, outputs, [c2])
    if isinstance(epilogue, Refusal):
        return epilogue
    if epilogue.reductions:
        return Refusal("a row reduction after attention's second product")
    if c2.outputs[0].type.shape[:-2] != c1.outputs[0].type.shape[:-2]:
        return Refusal("the two products' batch dims differ")
    keys = c1.outputs[0].type.shape[-1]
    if sm.quotient is not None and keys > target.attention.key_tile:
        return Refusal(f"a map of the probabilities needs whole rows: {keys} keys > one key tile of "
                       f"{target.attention.key_tile}")
    return AttentionMatch(c1, c2, sm, epilogue)


def attention_problem(
    contractions: Sequence[Node], reductions: Sequence[Node], members: set[int], target: Target
) -> Refusal | None:
    """Why two products (and the reductions beside them) cannot grow into one attention
    kernel, or None while they still can."""
    if len(contractions) != 2 or not all(isinstance(c.op, MatMul) for c in contractions):
        return Refusal("more than one contraction, and not an attention chain")
    first, second = contractions
    pair = chained(first, second, members)
    if pair is None:
        return Refusal("two independent contractions on different inputs")
    c1, c2 = pair
    p, v = c2.inputs
    v_from_c1 = v.producer is not None and id(v.producer) in members and (
        v.producer is c1 or depends_within(v.producer, c1, members)
    )
    if p.producer is None or id(p.producer) not in members or v_from_c1:
        return Refusal("the second product must take the first's row-wise result as its left operand")
    if c1.inputs[1].is_constant or c2.inputs[1].is_constant:
        return Refusal("a chain of products with weights does not stream (attention multiplies activations)")
    m, n = contraction_rows(c1)
    if not reductions:
        return Refusal("two chained products fuse only through a row softmax (flash-style)")
    if c2.inputs[0].type.shape[-1] != n:
        return Refusal("the second product does not reduce over the first's columns")
    for r in reductions:
        if row_signature(r) != (m, n):
            return Refusal(f"attention's row ops must reduce the score rows {(m, n)}, not {row_signature(r)}")
    head = max(c1.inputs[0].type.shape[-1], c2.outputs[0].type.shape[-1])
    if head > target.attention.max_head_dim:
        return Refusal(f"head dim {head} > {target.attention.max_head_dim} kept on chip")
    return None
