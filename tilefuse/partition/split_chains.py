"""A host's weight chain over few rows is split along its hidden dim, one part a core.

A chain ``act(x @ W1 + b1) @ W2`` (bert-base's MLP: 128 tokens by 19 MB of weights) is
one kernel whose tiles hold whole rows (``patterns/gemm.py``); with few rows there are
as many row tiles as cores, and every tile walks all of W1 and W2: each core reads the
whole 19 MB from memory, and one thread reads it once a tile. The hidden dim ``H`` is
split into ``P`` parts (the target's cores) instead:

    z = act(x @ W1p + b1p) @ W2p      # W1p [P, K, H / P], b1p [P, 1, H / P], W2p [P, H / P, N]
    y = z[0] + z[1] + ... + z[P - 1]   # [M, N], then the chain's epilogue as before

The first line is still one chain kernel, batched by the parts: a part is one tile of
all the rows, each part's panels are read once, and a core takes its own part. The sum
and whatever read the chain's output (bias, residual, a LayerNorm) form the next kernel.
The parts are summed in a different order than one K loop would, so results differ by
rounding only.

Only where it pays: a host target (packed panels, no blocks), float32 products by
constant weights, the input's leading dims 1 (one sequence: its rows are the rows of
every part), more than 16 rows, weights larger than a core's cache, parts whose width is
whole K chunks (``GemmPolicy.tile_k``), and less traffic past the core's cache than the
whole chain's row tiles would move: each of those reads every weight, where a part's
tile of all the rows reads its weights once but may outgrow the cache (its accumulator
then passes through the next level once a K chunk: ``tilefuse/chain_rows.py``). Many rows make tiles
for every core anyway, and the accumulators of a split would not fit.

The rewrite runs on the primitive graph before grouping, in place: the last node writes
the chain's original output value, so its readers and the graph's outputs are unchanged;
the new nodes keep the original nodes' ``origin``.
"""
from __future__ import annotations

import math

import numpy as np

from tilefuse.ir.dtypes import DType
from tilefuse.ir.graph import Graph, Node, Value
from tilefuse.ir.prims import Map, MatMul, Reshape, ScalarFn, Slice
from tilefuse.ir.types import TensorType
from tilefuse.chain_rows import chain_tiles
from tilefuse.partition.rewrite import Emitter, FreshNames
from tilefuse.target import Target


def split_weight_chains(graph: Graph, target: Target) -> list[Node]:
    """Split each weight chain of ``graph`` that ``target``'s cores would each read whole
    (see the module's docstring); returns the second products of the chains split."""
    parts = target.device.cores
    width = target.gemm.panel_width
    if parts < 2 or not width or target.device.max_block_threads:
        return []
    names = FreshNames(graph)
    split = []
    for c2 in [n for n in graph.nodes if isinstance(n.op, MatMul)]:
        chain = _chain(c2, {id(n): i for i, n in enumerate(graph.nodes)}, {id(v) for v in graph.outputs.values()})
        if chain is None:
            continue
        c1, between = chain
        if _worth(c1, c2, parts, target):
            _split(graph, c1, between, c2, parts, names)
            split.append(c2)
    return split


def _chain(c2: Node, position: dict[int, int], outputs: set[int]) -> tuple[Node, list[Node]] | None:
    """(first product, nodes between in graph order) of the float32 weight chain whose
    second product is ``c2``: between them only elementwise nodes, whose other operands
    are constants along the hidden dim (a bias) or scalars, and reshapes that add or drop
    leading 1s (GPT-2's ``[128, 3072]`` viewed as ``[1, 128, 3072]``), and nothing
    outside the chain reads the intermediate; None otherwise. ``position``: each node's
    place in the graph; ``outputs``: ids of the graph's outputs (read outside too)."""
    if not _weight_product(c2):
        return None
    hidden = _rows(c2.inputs[0].type)
    if hidden is None:
        return None
    between: list[Node] = []
    stack, seen = [c2.inputs[0]], set()
    c1 = None
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        n = v.producer
        if n is None or v.is_constant or _rows(v.type) != hidden or v.type.dtype is not DType.FLOAT32:
            return None
        if isinstance(n.op, MatMul):
            if c1 is not None and n is not c1 or not _weight_product(n):
                return None
            c1 = n
            continue
        if isinstance(n.op, Reshape):
            stack.append(n.inputs[0])
        elif isinstance(n.op, Map) and n.op.fn is not ScalarFn.CAST:
            for x in n.inputs:
                if not _along_hidden(x, hidden[1]):
                    stack.append(x)
        else:
            return None
        between.append(n)
    if c1 is None:
        return None
    inside = {id(n) for n in (c1, *between, c2)}
    if any(id(u) not in inside for n in (c1, *between) for u in n.outputs[0].users) \
            or any(id(n.outputs[0]) in outputs for n in (c1, *between)):
        return None
    return c1, sorted(between, key=lambda n: position[id(n)])


def _rows(t: TensorType) -> tuple[int, int] | None:
    """(rows, last dim) of a tensor whose dims before its last two are 1, else None."""
    if t.rank < 2 or any(d != 1 for d in t.shape[:-2]):
        return None
    return t.shape[-2], t.shape[-1]


def _weight_product(c: Node) -> bool:
    x, w = c.inputs
    return (isinstance(c.op, MatMul) and w.is_constant and w.type.rank == 2 and x.type.dtype is DType.FLOAT32
            and w.type.dtype is DType.FLOAT32 and all(d == 1 for d in x.type.shape[:-2]))


def _along_hidden(x: Value, hidden: int) -> bool:
    """A constant that is a scalar or a vector along the last dim (leading dims 1)."""
    if not x.is_constant or x.type.dtype is not DType.FLOAT32:
        return False
    shape = x.type.shape
    return x.type.size == 1 or (shape[-1] == hidden and all(d == 1 for d in shape[:-1]))


def _worth(c1: Node, c2: Node, parts: int, target: Target) -> bool:
    """More than 16 rows, weights larger than a core's cache, parts of whole K chunks,
    and fewer bytes past the core's cache split than whole (``tilefuse/chain_rows.py``: each
    part's tiles over all the rows, and the parts' sums written and read back, against
    the whole chain's tiles, every one of which reads both weights)."""
    x, w1 = c1.inputs
    w2 = c2.inputs[1]
    rows, k = math.prod(x.type.shape[:-1]), x.type.shape[-1]
    hidden, n = w2.type.shape
    part, width, cache = hidden // parts, target.gemm.panel_width, target.device.onchip_bytes
    weights = (w1.type.size + w2.type.size) * 4
    # (16 rows or fewer: a host's chain takes no row tiles, lower/gemm_tiles._host_row_tail)
    chunk = min(part, target.gemm.tile_k)
    if not (rows > 16 and weights > cache and hidden % parts == 0 and part % chunk == 0
            and chunk % (4 * width) == 0 and k % width == 0):
        return False
    each = chain_tiles(rows, n, part, weights // parts, 1, chunk, width, cache)
    whole = chain_tiles(rows, n, hidden, weights, parts, min(hidden, target.gemm.tile_k), width, cache)
    return each.traffic * parts + 2 * parts * rows * n * 4 < whole.traffic


def _split(graph: Graph, c1: Node, between: list[Node], c2: Node, parts: int, names: FreshNames) -> None:
    """Replace the chain by its ``parts`` form (module docstring)."""
    x, w1 = c1.inputs
    w2 = c2.inputs[1]
    k, hidden = w1.type.shape
    n = w2.type.shape[1]
    part = hidden // parts
    emit = Emitter(c1, names)

    def const(base: Value, data: np.ndarray) -> Value:
        data = np.ascontiguousarray(data)
        data.setflags(write=False)
        return Value(names.fresh(f"{base.name}.parts{parts}"), TensorType(base.type.dtype, data.shape), data=data)

    assert w1.data is not None and w2.data is not None
    w1p = const(w1, w1.data.reshape(k, parts, part).transpose(1, 0, 2))
    w2p = const(w2, w2.data.reshape(parts, part, n))
    new = {id(c1.outputs[0]): emit(MatMul(), (x, w1p), "parts")}
    for node in between:
        if isinstance(node.op, Reshape):  # leading 1s: every part is [P, rows, H / P]
            new[id(node.outputs[0])] = new[id(node.inputs[0])]
            continue
        args = []
        for v in node.inputs:
            if id(v) in new:
                args.append(new[id(v)])
            elif v.type.size == 1:
                args.append(v)
            else:
                assert v.data is not None
                args.append(const(v, v.data.reshape(parts, 1, part)))
        new[id(node.outputs[0])] = emit(node.op, args, "parts", origin=node)
    z = emit(MatMul(), (new[id(c2.inputs[0])], w2p), "parts", origin=c2)
    out = c2.outputs[0]
    rows = z.type.shape[1]
    total: Value | None = None
    for p in range(parts):
        piece = emit(Slice((p, 0, 0), (1, 1, 1), (1, rows, n)), z, f"part{p}", origin=c2)
        last = p == parts - 1 and out.type == piece.type
        total = piece if total is None else emit(Map(ScalarFn.ADD), (total, piece), "sum", out if last else None,
                                                 origin=c2)
    assert total is not None
    if total is not out:
        emit(Reshape(out.type.shape), total, "shaped", out, origin=c2)
    old = (c1, *between, c2)
    for node in old:
        for v in node.inputs:
            v.users[:] = [u for u in v.users if u is not node]
    at = graph.nodes.index(c2)
    graph.nodes[at:at + 1] = emit.made
    gone = {id(node) for node in old if node is not c2}
    graph.nodes[:] = [node for node in graph.nodes if id(node) not in gone]
