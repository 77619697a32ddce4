"""SwiGLU -> Map primitives: ``Y = A * sigmoid(alpha * A) * B``.

The gate and value inputs usually come from two projections (or a split of one), so
this is the elementwise epilogue the partitioner fuses into the contraction before it.
"""
from __future__ import annotations

from tilefuse.frontend.context import NodeContext
from tilefuse.frontend.converters.reduce import scalar, to_compute
from tilefuse.frontend.registry import converter
from tilefuse.ir.graph import Value
from tilefuse.ir.prims import ScalarFn as F


@converter("SwiGLU", since=28)
def swiglu(ctx: NodeContext) -> Value:
    """Swish-gated linear unit of equal-shaped ``A`` (gate) and ``B`` (value); half
    floats compute in float32 and round once."""
    b, gate, value = ctx.b, ctx.input(0), ctx.input(1)
    if gate.type != value.type:
        raise ctx.error(f"A and B must have the same type and shape, got {gate.type} and {value.type}")
    g, v = to_compute(b, gate), to_compute(b, value)
    alpha = float(ctx.attr("alpha", 1.0))
    scaled = g if alpha == 1.0 else b.map(F.MUL, g, scalar(b, alpha, g))
    y = b.map(F.MUL, b.map(F.MUL, g, b.map(F.SIGMOID, scaled)), v)
    return b.cast(y, gate.type.dtype)
