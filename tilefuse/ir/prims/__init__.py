"""The primitive vocabulary of the graph IR (DESIGN.md, "Graph and primitives")."""
from tilefuse.ir.prims.base import Kind, Primitive
from tilefuse.ir.prims.contract import Conv, ConvTranspose, MatMul
from tilefuse.ir.prims.index import (
    Broadcast,
    Concat,
    Gather,
    GatherElements,
    GatherND,
    Pad,
    PadMode,
    Reshape,
    ScatterElements,
    ScatterND,
    ScatterReduction,
    Slice,
    Transpose,
)
from tilefuse.ir.prims.map import Map, ScalarFn, cast_array
from tilefuse.ir.prims.opaque import CumProd, CumSum, TopK
from tilefuse.ir.prims.reduce import Reduce, ReduceFn, WindowReduce

__all__ = [
    "Broadcast", "Concat", "Conv", "ConvTranspose", "CumProd", "CumSum", "Gather",
    "GatherElements", "GatherND", "Kind", "Map", "MatMul", "Pad", "PadMode", "Primitive",
    "Reduce", "ReduceFn", "Reshape", "ScalarFn", "ScatterElements", "ScatterND",
    "ScatterReduction", "Slice", "TopK", "Transpose", "WindowReduce", "cast_array",
]
