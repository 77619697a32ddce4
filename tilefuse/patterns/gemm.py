"""A contraction with its epilogue: one tiled product, or a few that share their tiles.

The kernel tiles one product's output (a matrix product; a convolution, ungrouped,
grouped or depthwise; an ungrouped transposed convolution) and computes every group
output from the tile on chip (``epilogue.py``). Two shapes widen it:

- siblings: products of one activation by constant weights of one shape (Q, K and V; a
  SwiGLU's gate and up) share the activation's tile — one wider product;
- a weight chain (an MLP): the first product's output reaches the second's left operand
  only through elementwise ops and row regroupings, and nothing else reads it, so a tile
  of rows computes the intermediate a column chunk at a time and never writes it.

While groups grow, ``row_epilogue_problem`` and ``chain_problem`` say whether whole rows
fit on chip; once the partition is final, ``match_gemm`` says which products the kernel
tiles and with which epilogue.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from tilefuse.ir.dtypes import DType
from tilefuse.ir.graph import Node, Value
from tilefuse.ir.prims import Conv, ConvTranspose, Kind, MatMul, Reshape
from tilefuse.patterns.dataflow import chained, contraction_rows, depends_within, row_signature
from tilefuse.patterns.epilogue import Epilogue, match_epilogue
from tilefuse.patterns.refusal import Refusal
from tilefuse.target import Target


@dataclass(frozen=True, slots=True)
class GemmMatch:
    """``contractions``: the products the kernel tiles (one, or siblings in group order);
    ``first``: a weight chain's first product, computed on chip as the second's prologue
    (then ``contractions`` is the second alone); ``epilogue``: what follows them."""

    contractions: tuple[Node, ...]
    first: Node | None
    epilogue: Epilogue

    @property
    def siblings(self) -> bool:
        return len(self.contractions) > 1

    @property
    def chain(self) -> bool:
        return self.first is not None

    @property
    def depthwise(self) -> bool:
        """A depthwise convolution: one input channel per group, one output channel per group."""
        c = self.contractions[0]
        op, x, w = c.op, c.inputs[0], c.inputs[1]
        return isinstance(op, Conv) and op.groups == x.type.shape[1] == w.type.shape[0] and w.type.shape[1] == 1


def siblings(contractions: Sequence[Node]) -> bool:
    """Matrix products of one activation by constant weights of one shape: one wide GEMM
    whose tiles share the activation's tile (grouped-query attention's Q beside K and V,
    wider than they are, runs apart)."""
    first = contractions[0]
    return all(
        isinstance(c.op, MatMul)
        and c.inputs[0] is first.inputs[0]
        and c.inputs[1].is_constant
        and c.inputs[1].type.rank == 2
        and c.inputs[1].type.shape == first.inputs[1].type.shape
        for c in contractions
    )


def weight_chain(
    contractions: Sequence[Node], members: set[int], written: frozenset[int] = frozenset()
) -> tuple[Node, Node] | Refusal:
    """(first, second) product of a weight chain inside ``members``, or why it is not one:
    the first's output reaches the second's left operand only through elementwise ops and
    reshapes that regroup rows, and nothing else reads the intermediate (it stays on chip).
    ``written``: ids of values written whatever their readers (graph or group outputs)."""
    if len(contractions) != 2 or not all(
        isinstance(c.op, MatMul) and c.inputs[1].is_constant and _chain_weight(c) for c in contractions
    ):
        return Refusal("more than two weight products, or not plain matrix products")
    first, second = contractions
    pair = chained(first, second, members)
    if pair is None:
        return Refusal("two independent contractions on different inputs")
    c1, c2 = pair
    a = c2.inputs[0]
    if a.producer is None or id(a.producer) not in members:
        return Refusal("the second product's left operand does not come from the first")
    mid = c1.outputs[0].type
    stack, between, seen = [a.producer], [], {id(c1)}
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        out = n.outputs[0].type
        rows_kept = out.size == mid.size and out.shape[-1:] == mid.shape[-1:]
        if not rows_kept or not (n.op.kind is Kind.MAP or isinstance(n.op, Reshape)):
            return Refusal("a chain of weight products fuses only through elementwise ops and row regroupings")
        between.append(n)
        stack += [v.producer for v in n.inputs if v.producer is not None and id(v.producer) in members]
    for n in [c1, *between]:
        if id(n.outputs[0]) in written or any(id(u) not in seen and u is not c2 for u in n.outputs[0].users):
            return Refusal("the intermediate of a chain of products is read outside the chain")
    return c1, c2


def _chain_weight(c: Node) -> bool:
    """A chain product's weight: a [K, N] matrix, or one such matrix per batch index of
    the product (``[B, K, N]`` by a ``[B, M, K]`` or ``[M, K]`` input: the parts of a
    chain split along its hidden dim, ``partition/split_chains.py``)."""
    w, out = c.inputs[1].type, c.outputs[0].type
    return w.rank == 2 or (w.rank == 3 and out.rank == 3 and w.shape[0] == out.shape[0]
                           and c.inputs[0].type.rank in (2, 3))


def row_epilogue_problem(c: Node, reductions: Sequence[Node], members: set[int], target: Target) -> Refusal | None:
    """Why a product cannot take ``reductions`` into its epilogue (whole output rows on a
    tile), or None."""
    if not isinstance(c.op, MatMul):
        return Refusal("a reduction after a convolution needs whole channel rows")
    m, n = contraction_rows(c)
    for r in reductions:
        if not depends_within(r, c, members):
            return Refusal("a reduction feeding a contraction needs whole rows before the product")
        if row_signature(r) != (m, n):
            return Refusal(f"the reduction's rows {row_signature(r)} are not the product's output rows {(m, n)}")
    need = target.gemm.row_epilogue_bytes(n)
    if need > target.device.onchip_bytes:
        return Refusal(f"needs {need // 1024} KB on chip for whole rows of {n} > {target.device.onchip_bytes // 1024} KB")
    if every_core_reads_the_weights(c, target):
        return Refusal(f"on a host, whole rows of {m} x {n} are one tile a core, each reading all of a weight several "
                       f"times a core's cache: apart, the product's column tiles split the weight between the cores")
    return None


def every_core_reads_the_weights(c: Node, target: Target) -> bool:
    """On a host, a product by a constant weight of several times the core's cache whose
    output rows fit one whole-row tile a core (``lower/gemm_tiles._host_whole_rows``):
    with a row epilogue every core walks the whole weight from memory (LLaMA's down
    projection and its RMSNorm: 46 MB over 128 tokens), where the product alone splits
    its column tiles between the cores (each weight panel read once, ``host_order``) and
    the rows kernel after it reads an output that is still in cache. LLaMA's 16 MB and
    46 MB projections: 9.5% and 6.6% faster apart at 2 threads, the norm's kernel
    included; bert-base's 2.4 MB attention output: the same either way (NOTES.md)."""
    if target.device.max_block_threads or not target.gemm.panel_width or not isinstance(c.op, MatMul):
        return False
    w = c.inputs[1]
    m, n = contraction_rows(c)
    return (w.is_constant and w.type.rank == 2 and w.type.size * w.type.dtype.itemsize > 4 * target.device.onchip_bytes
            and m * n * 4 <= target.device.onchip_bytes // 2)


def chain_problem(
    contractions: Sequence[Node], reductions: Sequence[Node], members: set[int], target: Target,
    written: frozenset[int] = frozenset(),
) -> Refusal | None:
    """Why two weight products back to back (an MLP: up-projection, activation,
    down-projection) cannot be one kernel, or None."""
    chain = weight_chain(contractions, members, written)
    if isinstance(chain, Refusal):
        return chain
    c1, c2 = chain
    exact = {x.inputs[i].type.dtype for x in (c1, c2) for i in (0, 1)} == {DType.FLOAT32} and not target.tf32_products
    if exact and target.device.mma_rows > 1:
        # exact float32 products are FMA loops there, the chain's accumulator whole rows in
        # shared memory: ViT's MLP chain at batch 32 took 34.7 ms a layer (60% of the run),
        # and its kernel raced on the H200 (replays differed)
        return Refusal("a chain of exact float32 products runs as FMA loops over whole rows on this target: "
                       "its products apart tile their columns")
    if target.device.max_block_threads and any(x.inputs[1].type.rank != 2 for x in (c1, c2)):
        return Refusal("a chain of products by a weight per batch index runs only on a host (packed panels)")
    for r in reductions:
        if not depends_within(r, c2, members) or row_signature(r) != contraction_rows(c2):
            return Refusal("a chain of products takes row reductions only after the second product")
    k1, n2 = c1.inputs[0].type.shape[-1], c2.outputs[0].type.shape[-1]
    need = target.gemm.row_epilogue_bytes(n2) + target.gemm.row_epilogue_bytes(k1)
    if need > target.device.onchip_bytes:
        return Refusal(f"a chain of products needs {need // 1024} KB on chip for whole rows "
                       f"({k1} in, {n2} out) > {target.device.onchip_bytes // 1024} KB")
    # Apart, the first product tiles its columns too; chained, only rows make tiles.
    rows = contraction_rows(c2)[0]
    tiles = -(-rows // target.gemm.row_tile)
    if tiles < target.device.cores:
        return Refusal(f"a chain of {rows} rows makes {tiles} whole-row tiles, fewer than the target's "
                       f"{target.device.cores} cores")
    return None


def product_extents(c: Node) -> tuple[tuple[int, ...], int, int, int]:
    """(batch, M, N, K) of a product as a GEMM: a matrix product's own; a convolution's
    rows are its output positions (images folded in), its columns the output channels,
    its K the input channels x taps (a transposed one's weight is [C, M / groups, *taps]);
    a grouped one's K is one group's input channels x taps (its column tiles lie inside
    one group)."""
    out = c.outputs[0].type.shape
    if isinstance(c.op, MatMul):
        return out[:-2], out[-2], out[-1], c.inputs[0].type.shape[-1]
    w = c.inputs[1].type.shape
    m = out[0] * math.prod(out[2:])
    if isinstance(c.op, Conv):
        return (), m, out[1], math.prod(w[1:])
    return (), m, out[1], w[0] // c.op.groups * math.prod(w[2:])  # type: ignore[attr-defined]


def _thin_rows(c: Node, whole_rows: bool, chain: bool, target: Target) -> Refusal | None:
    """Where the target's product tiles divide the rows (no matrix unit that takes a
    partial last tile, no forced edge), rows past 64 with no divisor of at least 8 within
    the row tile make tiles too thin to pay: the staged schedule takes them (a
    convolution's positions on the CPU). A host's matrix products take a partial last
    row tile (ViT's 197 tokens: ``lower/gemm_tiles.py``), a chain where its input is read
    in place (packed panels; one that is not finds no tiles at lowering and falls through
    to the staged schedule). Tiles only shrink from that divisor, so no tile plan is lost."""
    if target.device.mma_rows > 1 or target.gemm.force_tile_m:
        return None
    if isinstance(c.op, MatMul) and (not chain or target.gemm.panel_width):
        return None
    m = product_extents(c)[1]
    cap = target.gemm.row_tile if whole_rows else (target.gemm.rows or target.gemm.tile)
    most = max(d for d in range(1, min(m, cap) + 1) if m % d == 0)
    if m > 64 and most < 8:
        return Refusal(f"{m} rows have no divisor tile of 8 to {cap} rows on a target whose tiles divide them")
    return None


def match_gemm(nodes: Sequence[Node], outputs: Sequence[Value], target: Target) -> GemmMatch | Refusal:
    """The products the group's kernel tiles and their epilogue, or why it is not one
    tiled product. From ``target``: whether its tiles must divide the rows."""
    contractions = [n for n in nodes if n.op.kind is Kind.CONTRACT]
    if not contractions or any(n.op.kind is Kind.OPAQUE for n in nodes):
        return Refusal("no contraction" if not contractions else "an opaque op")
    c = contractions[0]
    first: Node | None = None
    members, written = {id(n) for n in nodes}, frozenset(id(v) for v in outputs)
    chain = weight_chain(contractions, members, written) if len(contractions) == 2 else None
    if isinstance(chain, tuple):  # a weight chain: the first product is the second's prologue
        first, c = chain
        contractions = [c]
        x, out = first.inputs[0].type, c.outputs[0].type
        # a chain's parts (a weight per batch index) read the one input's rows each: its
        # panels schedule reads them in place, batch broadcast (lower/panels.py)
        parts = first.inputs[1].type.rank == 3 and x.shape[:-2] in ((), (1,)) and x.shape[-2] == out.shape[-2]
        if not parts and x.size != math.prod(out.shape[:-1]) * x.shape[-1]:
            return Refusal("the first product's rows are broadcast: not one row per output row")
    elif len(contractions) > 1:  # sibling products on one activation: share the A tile
        same = all(x.outputs[0].type == c.outputs[0].type for x in contractions)
        if not (siblings(contractions) and same):
            return Refusal("several products, neither siblings nor a weight chain")
    if not isinstance(c.op, (MatMul, Conv, ConvTranspose)):
        return Refusal(f"{c.op.name} is not a matrix product or convolution")
    epilogue = match_epilogue(nodes, outputs, contractions)
    if isinstance(epilogue, Refusal):
        return epilogue
    if epilogue.reductions and len(contractions) > 1:
        return Refusal("sibling products cannot share a row reduction epilogue")
    thin = _thin_rows(c, bool(epilogue.reductions) or first is not None, first is not None, target)
    if thin is not None:
        return thin
    return GemmMatch(tuple(contractions), first, epilogue)
