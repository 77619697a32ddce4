"""CumProd -> the Opaque CumProd primitive (the product twin of CumSum)."""
from __future__ import annotations

from tilefuse.frontend.context import NodeContext
from tilefuse.frontend.converters.reduce import running
from tilefuse.frontend.registry import converter
from tilefuse.ir.graph import Value
from tilefuse.ir.prims import CumProd


@converter("CumProd", since=26)
def cumprod(ctx: NodeContext) -> Value:
    return running(ctx, CumProd)
