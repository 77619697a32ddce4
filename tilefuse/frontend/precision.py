"""``--precision``: run a float32 model's arithmetic in a half type.

``with_precision(graph, "fp16")`` returns a graph in which every float32 value is float16
(or bfloat16): weights are converted once (float16 clamps to its largest finite value, so
a -1e9 attention mask stays a large negative number instead of -inf), float32 inputs are
cast on entry, and outputs are cast back, so the model's inputs and outputs keep their
dtypes. Products, softmax and norms still accumulate in float32: the lowering widens half
floats in every accumulator. ``fp32`` (the default) leaves the graph alone; models that
are already float16 run as they are under any precision.

``tf32`` leaves the graph alone too: it is a property of the products, not of the values
(``precision_target``): float32 matrix products may round their operands to TF32 on
tensor cores (10-bit mantissa, float32 range and accumulation), where the target has them.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from tilefuse.errors import TilefuseError
from tilefuse.ir.builder import Builder
from tilefuse.ir.control import Branch
from tilefuse.ir.dtypes import DType
from tilefuse.ir.graph import Graph, Value
from tilefuse.ir.prims import Map, ScalarFn
from tilefuse.target import Target

PRECISIONS = {"fp32": None, "tf32": None, "fp16": DType.FLOAT16, "bf16": DType.BFLOAT16}
_FP16_MAX = float(np.finfo(np.float16).max)


def with_precision(graph: Graph, precision: str) -> Graph:
    if precision not in PRECISIONS:
        raise TilefuseError(f"unknown precision {precision!r}; known: {sorted(PRECISIONS)}")
    half = PRECISIONS[precision]
    if half is None:
        return graph
    b = Builder(graph.name, fold=False)
    new: dict[int, Value] = {}

    def lowered(v: Value) -> Value:
        """``v`` in the new graph, float32 turned half."""
        got = new.get(id(v))
        if got is None:  # a constant
            got = new[id(v)] = _const(b, v, half)
        if got.type.dtype is DType.FLOAT32:
            got = new[id(v)] = b.cast(got, half)
        return got

    for v in graph.inputs:
        new[id(v)] = b.input(v.name, v.type)
    for node in graph.nodes:
        op = node.op
        if isinstance(op, Map) and op.fn is ScalarFn.CAST and op.to is DType.FLOAT32:
            op = Map(ScalarFn.CAST, half)
        b.origin = node.origin
        if isinstance(op, Branch):
            # Each branch runs in half itself and keeps its inputs' and outputs' dtypes
            # (as a whole graph does), so the branch reads its values as they were typed.
            op = Branch(with_precision(op.then_graph, precision), with_precision(op.else_graph, precision))
            inputs = [b.cast(lowered(v), v.type.dtype) for v in node.inputs]
        else:
            inputs = [lowered(v) for v in node.inputs]
        outs = b.emit(op, inputs, hint=node.name)
        for old, out in zip(node.outputs, outs):
            new[id(old)] = out
    for name, v in graph.outputs.items():
        want = v.type.dtype
        out = lowered(v) if want is DType.FLOAT32 or id(v) not in new else new[id(v)]
        b.output(name, b.cast(out, want))
    return b.graph


def _const(b: Builder, v: Value, half: DType) -> Value:
    data = v.data
    assert data is not None
    if v.type.dtype is DType.FLOAT32:
        if half is DType.FLOAT16:
            data = np.clip(data, -_FP16_MAX, _FP16_MAX)
        return b.const(np.asarray(data).astype(half.numpy), half, name=v.name)
    return b.const(data, v.type.dtype, name=v.name)


def precision_target(target: Target, precision: str) -> Target:
    """``target`` with its products' precision: under ``tf32`` float32 products may use
    TF32 tensor cores (targets without them stay exact float32)."""
    if precision not in PRECISIONS:
        raise TilefuseError(f"unknown precision {precision!r}; known: {sorted(PRECISIONS)}")
    return dataclasses.replace(target, tf32_products=precision == "tf32")
