"""The graph IR: typed values, primitive nodes, graphs, their verifier and printer.

No onnx import here: the IR is testable without it.
"""
from tilefuse.ir.builder import Builder
from tilefuse.ir.dtypes import DType
from tilefuse.ir.graph import Graph, Node, Value
from tilefuse.ir.printer import format_graph
from tilefuse.ir.types import Shape, TensorType, broadcast_shapes
from tilefuse.ir.verify import verify_graph

__all__ = [
    "Builder", "DType", "Graph", "Node", "Shape", "TensorType", "Value",
    "broadcast_shapes", "format_graph", "verify_graph",
]
