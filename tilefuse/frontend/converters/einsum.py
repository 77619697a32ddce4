"""Einsum -> transposes, reshapes, Reduce SUM and one MatMul per pair of operands.

The equation is parsed into per-operand label lists (an ellipsis becomes numbered
labels, right-aligned across operands). Then, in order:

1. a label repeated within one operand takes that operand's diagonal (a Gather on the
   two dims flattened together);
2. a label no other operand and not the output uses is summed out (Reduce SUM);
3. operands are contracted left to right: labels in both and still needed are batch
   dims, labels in both and no longer needed are contracted, the rest are free. The
   pair becomes ``[*batch, M, K] x [*batch, K, N]`` (one MatMul), or a broadcast Map
   MUL when nothing is contracted;
4. the result is transposed to the output's label order.
"""
from __future__ import annotations

import math
import string
from dataclasses import dataclass

import numpy as np

from tilefuse.frontend.context import NodeContext
from tilefuse.frontend.registry import converter
from tilefuse.ir.builder import Builder
from tilefuse.ir.graph import Value
from tilefuse.ir.prims import Gather, ReduceFn
from tilefuse.ir.prims import ScalarFn as F

Labels = list[str]
_LETTERS = set(string.ascii_letters)


@dataclass
class Operand:
    value: Value
    labels: Labels  # one per dim

    def size(self, label: str) -> int:
        return self.value.type.shape[self.labels.index(label)]


def _ellipsis_labels(count: int, total: int) -> Labels:
    """Labels for the last ``count`` of ``total`` ellipsis dims ("...0" is the first)."""
    return [f"...{i}" for i in range(total - count, total)]


def _parse_term(ctx: NodeContext, term: str, rank: int | None, total_ellipsis: int) -> Labels:
    head, dots, tail = term.partition("...")
    if "." in head + tail or not set(head + tail) <= _LETTERS:
        raise ctx.error(f"bad equation term {term!r}")
    if not dots:
        return list(head + tail)
    count = total_ellipsis if rank is None else rank - len(head) - len(tail)
    if count < 0:
        raise ctx.error(f"term {term!r} has more labels than its operand has dims")
    return list(head) + _ellipsis_labels(count, total_ellipsis) + list(tail)


def parse_equation(ctx: NodeContext, equation: str, ranks: list[int]) -> tuple[list[Labels], Labels]:
    """Per-operand labels and the output's labels (implicit form: ellipsis dims, then
    the labels used once, in ASCII order)."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ctx.error(f"equation {equation!r} has {len(terms)} terms for {len(ranks)} inputs")
    ellipsis = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t), default=0)
    inputs = [_parse_term(ctx, t, r, ellipsis) for t, r in zip(terms, ranks)]
    for labels, rank in zip(inputs, ranks):
        if len(labels) != rank:
            raise ctx.error(f"equation {equation!r} does not match an operand of rank {rank}")
    if arrow:
        output = _parse_term(ctx, rhs, None, ellipsis)
    else:
        letters = [l for labels in inputs for l in labels if not l.startswith("...")]
        once = sorted(l for l in set(letters) if letters.count(l) == 1)
        output = _ellipsis_labels(ellipsis, ellipsis) + once
    if len(set(output)) != len(output):
        raise ctx.error(f"equation {equation!r} repeats an output label")
    return inputs, output


def take_diagonals(b: Builder, op: Operand) -> Operand:
    """Replace each label repeated within ``op`` by its diagonal."""
    x, labels = op.value, list(op.labels)
    while len(set(labels)) < len(labels):
        label = next(l for l in labels if labels.count(l) > 1)
        p = labels.index(label)
        q = labels.index(label, p + 1)
        n = x.type.shape[p]
        if x.type.shape[q] != n:
            raise ValueError(f"einsum: label {label!r} has sizes {n} and {x.type.shape[q]}")
        rest = [i for i in range(len(labels)) if i not in (p, q)]
        x = b.transpose(x, rest + [p, q])
        x = b.reshape(x, tuple(x.type.shape[: len(rest)]) + (n * n,))
        x = b.emit1(Gather(len(rest)), x, b.const(np.arange(n, dtype=np.int64) * (n + 1)))
        labels = [labels[i] for i in rest] + [label]
    return Operand(x, labels)


def sum_out(b: Builder, op: Operand, keep: set[str]) -> Operand:
    """Sum the labels of ``op`` not in ``keep``."""
    axes = [i for i, l in enumerate(op.labels) if l not in keep]
    if not axes:
        return op
    y = b.reduce(ReduceFn.SUM, op.value, axes, keepdims=False)
    return Operand(y, [l for l in op.labels if l in keep])


def _drop_unit(b: Builder, op: Operand, label: str) -> Operand:
    i = op.labels.index(label)
    shape = op.value.type.shape
    return Operand(b.reshape(op.value, shape[:i] + shape[i + 1 :]), op.labels[:i] + op.labels[i + 1 :])


def _arrange(b: Builder, op: Operand, groups: list[Labels]) -> Value:
    """Transpose ``op`` to the concatenated ``groups`` and merge each group into one dim."""
    order = [l for g in groups for l in g]
    x = b.transpose(op.value, [op.labels.index(l) for l in order])
    return b.reshape(x, [math.prod(op.size(l) for l in g) for g in groups])


def contract(b: Builder, a: Operand, c: Operand, keep: set[str]) -> Operand:
    """``a * c`` summed over their shared labels not in ``keep``."""
    # A label shared but broadcast (size 1 on one side) and summed: drop it there.
    for label in [l for l in a.labels if l in c.labels and l not in keep]:
        if a.size(label) != c.size(label):
            a, c = (_drop_unit(b, a, label), c) if a.size(label) == 1 else (a, _drop_unit(b, c, label))
    a = sum_out(b, a, keep | set(c.labels))
    c = sum_out(b, c, keep | set(a.labels))
    batch = [l for l in a.labels if l in c.labels and l in keep]
    summed = [l for l in a.labels if l in c.labels and l not in keep]
    free_a = [l for l in a.labels if l not in c.labels]
    free_c = [l for l in c.labels if l not in a.labels]
    if not summed:
        return _outer(b, a, c, batch, free_a, free_c)
    x = _arrange(b, a, [[l] for l in batch] + [free_a, summed])
    y = _arrange(b, c, [[l] for l in batch] + [summed, free_c])
    z = b.matmul(x, y)
    lead = z.type.shape[: len(batch)]
    z = b.reshape(z, lead + tuple(a.size(l) for l in free_a) + tuple(c.size(l) for l in free_c))
    return Operand(z, batch + free_a + free_c)


def _outer(b: Builder, a: Operand, c: Operand, batch: Labels, free_a: Labels, free_c: Labels) -> Operand:
    """Nothing to sum: a broadcast elementwise product laid out as batch, free_a, free_c."""
    x = b.transpose(a.value, [a.labels.index(l) for l in batch + free_a])
    x = b.reshape(x, x.type.shape + (1,) * len(free_c))
    y = b.transpose(c.value, [c.labels.index(l) for l in batch + free_c])
    y = b.reshape(y, y.type.shape[: len(batch)] + (1,) * len(free_a) + y.type.shape[len(batch) :])
    return Operand(b.map(F.MUL, x, y), batch + free_a + free_c)


@converter("Einsum", since=12)
def einsum(ctx: NodeContext) -> Value:
    b = ctx.b
    values = [v for v in ctx.inputs if v is not None]
    if not values:
        raise ctx.error("Einsum needs at least one input")
    inputs, output = parse_equation(ctx, ctx.attr("equation"), [v.type.rank for v in values])
    ops = [take_diagonals(b, Operand(v, labels)) for v, labels in zip(values, inputs)]
    for i, op in enumerate(ops):
        others = {l for j, o in enumerate(ops) if j != i for l in o.labels}
        ops[i] = sum_out(b, op, others | set(output))
    result = ops[0]
    for i in range(1, len(ops)):
        later = {l for o in ops[i + 1 :] for l in o.labels}
        result = contract(b, result, ops[i], later | set(output))
    missing = [l for l in output if l not in result.labels]
    if missing:
        raise ctx.error(f"output labels {missing} appear in no input")
    result = sum_out(b, result, set(output))
    return b.transpose(result.value, [result.labels.index(l) for l in output])
