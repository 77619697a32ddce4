"""Classification losses -> GatherElements, Gather, Where, Reduce and Map primitives.

``NegativeLogLikelihoodLoss`` picks ``-input[n, target[n, d...], d...]`` with a
GatherElements on the class axis, weights it by ``weight[target]`` (a Gather), zeroes
the ``ignore_index`` positions with a Where and reduces. ``SoftmaxCrossEntropyLoss`` is
the same after a log-softmax over the class axis (the primitives of :mod:`softmax`).
Half floats compute in float32 and round once at the end, as onnxruntime does.
"""
from __future__ import annotations

from tilefuse.frontend.context import NodeContext
from tilefuse.frontend.converters.reduce import scalar, to_compute
from tilefuse.frontend.converters.softmax import log_softmax_of
from tilefuse.frontend.registry import converter
from tilefuse.ir.builder import Builder
from tilefuse.ir.graph import Value
from tilefuse.ir.prims import Gather, GatherElements, ReduceFn
from tilefuse.ir.prims import ScalarFn as F

REDUCTIONS = ("none", "sum", "mean")


def _check_operands(ctx: NodeContext, x: Value, target: Value, weight: Value | None) -> None:
    """``x [N, C, d...]``, ``target [N, d...]`` (integer), ``weight [C]``."""
    xs, ts = x.type.shape, target.type.shape
    if x.type.rank < 2 or ts != xs[:1] + xs[2:]:
        raise ctx.error(f"input must be [N, C, d...] and target [N, d...], got {x.type} and {target.type}")
    if not target.type.dtype.is_int:
        raise ctx.error(f"target must be an integer tensor, got {target.type.dtype}")
    if weight is not None and weight.type.shape != (xs[1],):
        raise ctx.error(f"weight must be [C] = [{xs[1]}], got {weight.type}")


def _reduction(ctx: NodeContext) -> str:
    reduction = ctx.attr("reduction", "mean")
    if reduction not in REDUCTIONS:
        raise ctx.unsupported(f"reduction={reduction!r}")
    return reduction


def nll_of(
    b: Builder, logp: Value, target: Value, weight: Value | None, ignore_index: int | None, reduction: str
) -> Value:
    """The negative log-likelihood loss of ``logp [N, C, d...]`` (in its compute dtype).

    Ignored positions read class 0 (any valid index would do) and contribute 0 to the
    loss and to the ``mean`` denominator, which is the sum of the picked weights (or the
    count of kept positions) rather than the number of positions.
    """
    ignored = None
    index = target
    if ignore_index is not None:
        ignored = b.map(F.EQ, target, scalar(b, ignore_index, target))
        index = b.map(F.WHERE, ignored, scalar(b, 0, target), target)
    column = b.reshape(index, index.type.shape[:1] + (1,) + index.type.shape[1:])
    picked = b.reshape(b.emit1(GatherElements(1), logp, column), target.type.shape)
    loss = b.map(F.NEG, picked)
    picked_weight = None
    if weight is not None:
        picked_weight = b.emit1(Gather(0), weight, index)
        loss = b.map(F.MUL, loss, picked_weight)
    if ignored is not None:
        zero = scalar(b, 0, loss)
        loss = b.map(F.WHERE, ignored, zero, loss)
        kept = picked_weight if picked_weight is not None else scalar(b, 1, loss)
        picked_weight = b.map(F.WHERE, ignored, zero, kept)
    if reduction == "none":
        return loss
    axes = tuple(range(loss.type.rank))
    total = b.reduce(ReduceFn.SUM, loss, axes, keepdims=False)
    if reduction == "sum":
        return total
    if picked_weight is None:
        return b.map(F.MUL, total, scalar(b, 1.0 / max(loss.type.size, 1), total))
    return b.map(F.DIV, total, b.reduce(ReduceFn.SUM, picked_weight, axes, keepdims=False))


def _loss(ctx: NodeContext, log_softmax: bool) -> list[Value]:
    b, x, target, weight = ctx.b, ctx.input(0), ctx.input(1), ctx.optional_input(2)
    _check_operands(ctx, x, target, weight)
    reduction = _reduction(ctx)
    dtype = x.type.dtype
    logp = to_compute(b, x)
    if log_softmax:
        logp = log_softmax_of(b, logp, (1,))
    if weight is not None:
        weight = b.cast(weight, logp.type.dtype)
    ignore_index = ctx.attr("ignore_index")
    loss = b.cast(nll_of(b, logp, target, weight, ignore_index, reduction), dtype)
    outputs = [loss]
    if log_softmax and len(ctx.node.output) > 1 and ctx.node.output[1]:
        outputs.append(b.cast(logp, dtype))
    return outputs


@converter("NegativeLogLikelihoodLoss", since=12)
def negative_log_likelihood_loss(ctx: NodeContext) -> list[Value]:
    """NLL loss over any rank; ``weight``, ``ignore_index``, reductions none/sum/mean."""
    return _loss(ctx, log_softmax=False)


@converter("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy_loss(ctx: NodeContext) -> list[Value]:
    """Log-softmax over the class axis, then the NLL loss; the optional second output
    is the log-probabilities."""
    return _loss(ctx, log_softmax=True)
