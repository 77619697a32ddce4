"""CumProd -> the Opaque CumProd primitive (the product twin of CumSum)."""
from __future__ import annotations

from tilefuse.frontend.context import NodeContext
from tilefuse.frontend.converters.reduce import normalize_axis
from tilefuse.frontend.registry import converter
from tilefuse.ir.graph import Value
from tilefuse.ir.prims import CumProd


@converter("CumProd", since=26)
def cumprod(ctx: NodeContext) -> Value:
    """Cumulative product along a compile-time ``axis`` input; exclusive and reverse variants."""
    x = ctx.input(0)
    axis_arr = ctx.const_input(1).reshape(-1)
    if axis_arr.size != 1:
        raise ctx.error(f"axis must hold one value, got {axis_arr.tolist()}")
    axis = normalize_axis(ctx, int(axis_arr[0]), x.type.rank)
    op = CumProd(axis, bool(ctx.attr("exclusive", 0)), bool(ctx.attr("reverse", 0)))
    return ctx.b.emit1(op, x)
