"""A product's epilogue applied block by block, while the block is still in cache.

A gemm+epilogue tile program computes its whole accumulator tile, then runs the epilogue
over it (scale, bias, a residual, an activation: one element in, one stored): the tile
goes to the core's L2 and back, and the epilogue's streams (the residual read, the output
written) run after the products instead of beside them. ResNet-50's 56 x 56 pointwise
convolution with its residual (64 -> 256 channels) spent 0.62-0.75 ms on the products
alone and 0.29-0.50 ms more on the epilogue (caches warm or not; benchmarks/NOTES.md,
session 27); onnxruntime's whole node took 0.67 ms.

``plan`` finds, in any statement list, a float32 ``StridedGemm`` (a pointwise
convolution's weight rows by its input's planes, read where they lie) into a local tile
``c`` (alone, or the only statement of its K loop), directly followed by its epilogue: a
nest of two parallel loops over ``c``'s rows and columns whose innermost statements are
plain stores, reading ``c`` only at ``[row, column]``, writing nothing the product reads.
``c`` must start at zero (``first_products``: its zeroing Fill is not printed), be
touched by nothing else, and have at most ``CpuOptions.block_epilogue_rows`` rows
(``ConvPolicy.in_place_channels`` gives pointwise convolutions such tiles, of whole
planes), or any rows where B's part of the product (K x the tile's columns) fits
``CpuOptions.block_epilogue_b_bytes``. The printer (``emit.py``) then walks the tile in
register blocks of the product core (``BLOCK_COLUMNS`` columns x up to ``BLOCK_ROWS`` rows):
each block's product, over every K step, goes to a small block buffer, and the epilogue
runs over that block's rows and columns at once, reading the block buffer in place of
``c``. ``c`` is never allocated. The sums are the product core's, in the same order, so
results are bit for bit those of the tile-wide form.

The blocks run a column of them at a time (all rows of 32 columns, then the next 32) on
short tiles; on tall ones (``Fusion.rows_outer``) a row of them at a time: the epilogue
then writes a few runs at once, each a whole row of the tile long, and B, which every row
of blocks reads whole, stays in the first-level cache. MobileNetV2's 112 x 112 expansion
(16 -> 96 channels, tiles of 96 x 224, one thread) took 0.53 ms tile-wide, 0.56 block by
block down the columns, 0.49 along the rows, with caches warm; 0.96 / 1.02 / 0.82 cold
(NOTES.md, session 32). The tile's sizes are constants, and so is every block's
(``row_runs``: the core's rule, unrolled at compile time): each block is printed with its
own, one call of the core's register block and epilogue loops of fixed trip counts.
"""
from __future__ import annotations

from dataclasses import dataclass

from tilefuse.codegen.cpu.first_products import Starts
from tilefuse.ir.dtypes import DType
from tilefuse.tile_ir import row_blocks
from tilefuse.tile_ir.ir import (Buffer, Expr, Fill, If, Load, Loop, LoopKind, Stmt, Store, StridedGemm, TileProgram, Var,
                                 map_loads, statements, subexpressions)
from tilefuse.tile_ir.nests import stmt_reads

# the product core's register block (codegen/cpu/prelude.py): columns, one AVX-512
# register pair (two AVX2 strips), and rows at most
BLOCK_COLUMNS = 32
BLOCK_ROWS = row_blocks.BLOCK_ROWS
# ... and without AVX-512, its 8-float strips' tallest block (tf_strip_16: 6 x 16)
STRIP_ROWS = 6


@dataclass(frozen=True)
class Fusion:
    """A product (``product``, inside ``k_loop`` when it has one) and the epilogue nest
    (``rows`` over ``c``'s rows, ``columns`` inside it) that runs block by block."""

    product: StridedGemm
    k_loop: Loop | None
    rows: Loop
    columns: Loop
    rows_outer: bool = False  # blocks a row of them at a time (module docstring)

    @property
    def c(self) -> Buffer:
        return self.product.c


@dataclass(frozen=True)
class Limits:
    """Which tiles run block by block (``CpuOptions``): ``tallest`` rows at most, or any
    rows (a row of blocks at a time) where B's part is at most ``b_bytes``; 0: never."""

    tallest: int
    b_bytes: int = 0


def plan(program: TileProgram, starts: Starts, limits: Limits) -> dict[int, Fusion]:
    """The fusions of ``program`` within ``limits``, keyed by the identity of the statement
    that starts each (the product, or its K loop); the epilogue nest is the statement after it."""
    local = {b.name for b in program.allocs}
    out: dict[int, Fusion] = {}
    if limits.tallest > 0:
        _walk(program.body, program, local, starts, limits, out)
    return out


def _walk(body: tuple[Stmt, ...], program: TileProgram, local: set[str], starts: Starts, limits: Limits,
          out: dict[int, Fusion]) -> None:
    for i, s in enumerate(body):
        if isinstance(s, (Loop, If)):
            _walk(s.body, program, local, starts, limits, out)
        if i + 1 < len(body):
            fusion = _fusion(s, body[i + 1], program, local, starts, limits)
            if fusion is not None:
                out[id(s)] = fusion


def _fusion(s: Stmt, nxt: Stmt, program: TileProgram, local: set[str], starts: Starts, limits: Limits) -> Fusion | None:
    k_loop = None
    product = s
    if isinstance(s, Loop) and s.kind is not LoopKind.PARALLEL and s.extent > 0 and len(s.body) == 1:
        k_loop, product = s, s.body[0]
    if not isinstance(product, StridedGemm):
        return None
    c = product.c
    if c.name not in local or c.dtype is not DType.FLOAT32 or len(c.shape) != 2 or min(c.shape) <= 0:
        return None
    # B's part of the whole product: K (every step's) x the tile's columns, in float32
    b_bytes = product.a.extents[-1] * (k_loop.extent if k_loop is not None else 1) * c.shape[1] * 4
    rows_outer = c.shape[0] > limits.tallest
    if rows_outer and b_bytes > limits.b_bytes:
        return None
    start = starts.products.get(id(product), False)  # (absent: the product adds to what c holds)
    if start is False or (start is not None and (k_loop is None or start != k_loop.var)):
        return None
    columns = _epilogue(nxt, c)
    if columns is None:
        return None
    assert isinstance(nxt, Loop)
    inputs = {product.a.buffer.name, product.b.buffer.name}
    if any(isinstance(x, Store) and x.buffer.name in inputs | {c.name} for x in statements((nxt,))):
        return None
    mine = {id(product), id(nxt), id(k_loop), *(id(y) for y in statements(nxt.body))}
    for x in statements(program.body):
        if id(x) in mine:
            continue  # c: the product's, the epilogue's and zeroing Fills not printed, nothing else's
        # c: the product's, the epilogue's and zeroing Fills not printed, nothing else's
        if isinstance(x, Fill) and x.buffer == c:
            if id(x) not in starts.dropped:
                return None
        elif stmt_reads(x, c) or isinstance(x, Store) and x.buffer == c:
            return None
    return Fusion(product, k_loop, nxt, columns, rows_outer)


def _epilogue(s: Stmt, c: Buffer) -> Loop | None:
    """The inner loop of ``s`` where ``s`` is an epilogue nest of ``c`` (module docstring)."""
    if not (isinstance(s, Loop) and s.kind is LoopKind.PARALLEL and s.extent == c.shape[0] and len(s.body) == 1):
        return None
    inner = s.body[0]
    if not (isinstance(inner, Loop) and inner.kind is LoopKind.PARALLEL and inner.extent == c.shape[1] and inner.body
            and all(isinstance(x, Store) for x in inner.body)):
        return None
    at = (s.var, inner.var)
    for x in inner.body:
        assert isinstance(x, Store)
        if not all(_reads_only_at(e, c, at) for e in (x.value, *x.indices)):
            return None
    return inner


def _reads_only_at(e: Expr, c: Buffer, at: tuple[Var, Var]) -> bool:
    """Whether every load of ``c`` in ``e`` is at exactly ``at``."""
    return all(x.indices == at for x in subexpressions(e) if isinstance(x, Load) and x.buffer == c)


def register_blocks(m: int, avx512: bool) -> list[tuple[int, int]]:
    """The blocks of rows the product is called for, a call a block: (first row, rows), in
    order. With AVX-512 the core's register blocks (``tf_strip_32``'s rule,
    ``row_blocks.blocks``: a weight in row blocks has the same); else pairs of
    ``tf_strip_16``'s (blocks of ``STRIP_ROWS``, the last 7 to 11 rows as two near-equal
    ones), at most ``BLOCK_ROWS`` a call, which the core splits into strips of 6 or 5 rows
    again. AVX-512's blocks for 16 rows (8 and 8) were strips of 4 + 4 rows for the AVX2
    core, 8 products a K step where 6-row strips have 12 (MobileNetV2's 32 -> 16
    projection over 112 x 112: 237 -> 162 us by hand); single 6-row calls cost
    EfficientNet-B0's 80 -> 480 expansion 8% (NOTES.md, session 37)."""
    if avx512:
        return row_blocks.blocks(m)
    strips = row_blocks.blocks(m, STRIP_ROWS)
    return [(first, sum(r for _, r in strips[k:k + 2])) for k, (first, _) in enumerate(strips) if k % 2 == 0]


def row_runs(m: int, avx512: bool) -> list[tuple[int, int, int]]:
    """The register blocks over ``m`` rows (``register_blocks``) as runs of equal blocks:
    (first row, blocks, rows each)."""
    runs: list[tuple[int, int, int]] = []
    for i, r in register_blocks(m, avx512):
        if runs and runs[-1][2] == r:
            first, count, _ = runs[-1]
            runs[-1] = (first, count + 1, r)
        else:
            runs.append((i, 1, r))
    return runs


def block_view(e: Expr, c: Buffer, view: Buffer) -> Expr:
    """``e`` with its loads of ``c`` reading ``view`` at the same indices."""
    return map_loads(e, lambda x: Load(view, x.indices) if x.buffer == c else x)
