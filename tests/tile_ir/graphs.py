"""Small IR graphs that tests of several stages lower (built with the IR builder, seeded)."""
from __future__ import annotations

import numpy as np

from tilefuse.ir import Builder, DType, Graph, TensorType
from tilefuse.ir.prims import ScalarFn


def qkv_graph(batch: int, seq: int, heads: int, d: int) -> Graph:
    """BERT's Q, K, V projections: x @ W + b per sibling, split into heads; K written
    [batch, heads, d, seq] (transposed for attention), Q and V [batch, heads, seq, d]."""
    rng = np.random.default_rng(0)
    e = heads * d
    b = Builder("qkv")
    x = b.input("x", TensorType(DType.FLOAT16, (batch, seq, e)))
    for name, perm in (("q", (0, 2, 1, 3)), ("k", (0, 2, 3, 1)), ("v", (0, 2, 1, 3))):
        w = b.const((rng.standard_normal((e, e)) * 0.05).astype(np.float16))
        y = b.map(ScalarFn.ADD, b.matmul(x, w), b.const((rng.standard_normal(e) * 0.05).astype(np.float16)))
        b.output(name, b.transpose(b.reshape(y, (batch, seq, heads, d)), perm))
    return b.graph
