"""The tile IR: a small, explicit, target-neutral kernel language.

Its vocabulary follows TileLang so that the CUDA lowering is close to one-to-one:

- a grid of tiles (``block_vars`` range over ``grid``) and a thread count per tile;
- buffers by scope: ``global`` (kernel parameters), ``shared`` and ``fragment`` (per tile);
- statements: Fill, Copy (region to region), Gemm, PanelGemm (a host's product by a
  packed weight), StridedGemm (a host's product of two operands where they lie),
  TapGemm (a host's product whose B rows lie at constant offsets of one on-chip buffer),
  Transpose (a host's 2-D block turned over), LaneTaps (a host's depthwise taps over vectors
  of channels), PlaneTaps (a host's depthwise taps over channel planes read where they lie), Winograd (a host's 3 x 3 convolution of a block of rows by minimal filtering),
  ReduceTile, Store, loops that are serial, parallel or pipelined with a number of
  stages, and If on a tile-uniform condition.

Expressions are scalar: index arithmetic (``IndexOp``), ``Load`` from a buffer, scalar
functions (``Call`` with a :class:`ScalarFn`, the same functions Map primitives use), and
``IndexCheck``: an index read from data at run time, wrapped into its range and checked
(an index outside it is recorded in the kernel's status word, see ``STATUS``).
Everything is a frozen dataclass: programs are values, hashable and printable.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Callable, Iterator

from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ReduceFn, ScalarFn
from tilefuse.tile_ir.schedule import Schedule


class Scope(enum.Enum):
    GLOBAL = "global"
    SHARED = "shared"
    FRAGMENT = "fragment"


@dataclass(frozen=True, slots=True)
class Buffer:
    name: str
    dtype: DType
    shape: tuple[int, ...]
    scope: Scope

    def __str__(self) -> str:
        return self.name


# -- expressions ------------------------------------------------------------------------
class Expr:
    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Var(Expr):
    """A loop variable or a block index (int64)."""

    name: str


@dataclass(frozen=True, slots=True)
class Const(Expr):
    value: float | int | bool
    dtype: DType


class IOp(enum.Enum):
    """Integer index arithmetic and comparisons (operands and results are int64 or bool)."""

    ADD = "+"
    SUB = "-"
    MUL = "*"
    FLOORDIV = "//"
    MOD = "%"
    MIN = "min"
    MAX = "max"
    LT = "<"
    LE = "<="
    GE = ">="
    EQ = "=="
    AND = "&&"
    OR = "||"


@dataclass(frozen=True, slots=True)
class IndexOp(Expr):
    op: IOp
    a: Expr
    b: Expr


@dataclass(frozen=True, slots=True)
class Load(Expr):
    """``buffer[indices]``; an index outside the buffer is a program error, except where
    the load sits in an untaken branch of a WHERE (codegen evaluates only one branch)."""

    buffer: Buffer
    indices: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class IndexCheck(Expr):
    """An ONNX index read at run time (``index``, int64) as a position in ``[0, extent)``:
    negative indices count from the end. One outside ``[-extent, extent)`` reads position
    0 instead, so no access leaves its buffer, and records check ``site`` and the value in
    the kernel's status word (``STATUS``), which the runtime turns into an error naming
    the ONNX node and input. The site numbers the program's checks (< ``index_sites``)."""

    index: Expr
    extent: int
    site: int


@dataclass(frozen=True, slots=True)
class Call(Expr):
    """A scalar function of the Map vocabulary, producing ``dtype``."""

    fn: ScalarFn
    args: tuple[Expr, ...]
    dtype: DType


# -- statements -------------------------------------------------------------------------
class Stmt:
    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Store(Stmt):
    buffer: Buffer
    indices: tuple[Expr, ...]
    value: Expr


@dataclass(frozen=True, slots=True)
class Fill(Stmt):
    buffer: Buffer
    value: Const


@dataclass(frozen=True, slots=True)
class Region:
    """``extents`` elements of ``buffer`` starting at ``offsets`` (per dim)."""

    buffer: Buffer
    offsets: tuple[Expr, ...]
    extents: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Copy(Stmt):
    """Copy a region to a region of as many elements (extents equal up to unit dims, so
    a 2-D tile can land in a batched tensor). Source elements outside the source buffer
    read as zero; destination elements outside the destination are not written (tails)."""

    src: Region
    dst: Region
    # a whole on-chip tile filled from a rectangle of a global tensor, element for element
    # (raised from a parallel nest by tile_ir/passes/copies.py): the GPU loads it in bulk
    # (T.copy: vectorised, asynchronous, overlapped by a pipelined loop); its leading source
    # dims beyond the tile's rank are fixed indices. Or a whole on-chip tile copied into
    # another of its shape (an accumulator into its shared mirror: passes/epilogues.py)
    bulk: bool = False


@dataclass(frozen=True, slots=True)
class Gemm(Stmt):
    """``c += op(a) @ op(b)`` on 2-D tiles, accumulating in c's dtype. ``tf32``: float32
    operands may be rounded to TF32 (a code generator with TF32 tensor cores uses them)."""

    a: Buffer
    b: Buffer
    c: Buffer
    trans_a: bool = False
    trans_b: bool = False
    tf32: bool = False
    # on a device with blocks: the product runs on tensor cores (tile_ir/passes/placement.py);
    # False: exact FMA loops
    tensor_cores: bool = False


@dataclass(frozen=True, slots=True)
class PanelGemm(Stmt):
    """``c += A @ B[k0:k0 + kc]`` on a host without blocks, both operands read in place.
    ``a`` is ``c``'s rows of A and ``kc`` of its columns: a region of unit extents but its
    last two dims (rows, then columns); rows of it past the end of its buffer add nothing.
    B is a constant weight bound packed as panels, ``b[P, K, width]``: element ``(p, j)``
    of B is ``b[j // width, p, j % width]`` (zero past B's last column); ``c``'s columns
    are those of panels ``panel0``, ``panel0 + 1``, ... (``c``'s width a multiple of
    ``width``), and B's rows from ``k0`` meet A's columns in order (those past B's K rows,
    and A's columns there, are not read). The host's product core walks them ``k_block``
    at a time: a panel's block stays in the first-level cache while the rows go by
    (codegen/cpu/prelude.py). ``columns``, where set, is how many of ``c``'s first
    columns the product computes (whole panels: a partial last column tile stops at the
    panel holding B's last column); the others are left as they were."""

    a: Region
    b: Buffer
    panel0: Expr
    k0: Expr
    c: Buffer
    k_block: int
    columns: Expr | None = None

    @property
    def k_group(self) -> int:
        """K values one column keeps together in ``b``: 4 in an integer product's panels
        (``uint8 A x int8 B -> int32 c``, B's int8 values stored as int8, or widened to
        int16 for a core without VNNI: element (p, j) at ``b[j // width, p // 4,
        (j % width) * 4 + p % 4]``, ``k0`` a multiple of 4), else 1."""
        return 4 if self.b.dtype in (DType.INT8, DType.INT16) else 1

    @property
    def width(self) -> int:
        return self.b.shape[2] // self.k_group

    @property
    def k_rows(self) -> int:
        """B's rows as packed (K rounded up to whole groups)."""
        return self.b.shape[1] * self.k_group


@dataclass(frozen=True, slots=True)
class StridedGemm(Stmt):
    """``c += A @ B`` on a host without blocks, both operands read where they lie: no
    operand tiles. ``a`` is ``c``'s rows of A: a region of unit extents but its last two
    dims (rows, then K columns). ``b`` holds B's K rows: a region of unit extents before
    dim ``k_axis`` (its K rows); every dim after it makes B's columns, in order, and those
    after the first of them span their whole dim, so a row of B is one run in memory
    (rows ``stride(k_axis)`` apart). A pointwise convolution with channels as rows: the
    weight's [Cout, Cin] rows by the input's channel planes (whole output rows of them).
    The host's register-blocked core (codegen/cpu/prelude.py) runs it. With ``a_blocks``
    (> 0), A's buffer is bound in row blocks of tiles of that many rows (``row_blocks.py``:
    the same [rows, K] values, each tile's register blocks stored in turn) and ``a`` is one
    whole tile of them; 0: rows as stored."""

    a: Region
    b: Region
    k_axis: int
    c: Buffer
    a_blocks: int = 0


@dataclass(frozen=True, slots=True)
class Transpose(Stmt):
    """``dst[j, i] = src[i, j]`` on a host without blocks: ``src`` a region of unit extents
    but its rows (one dim, ``i``) and its columns (the buffer's last dim, ``j``: each row
    one run), ``dst`` likewise with the extents swapped (``transpose_dims``). A depthwise convolution's
    channel planes turned into vectors of channels per position, and back
    (``conv_rows.depthwise_lanes_tile``); the host runs it in 16 x 16 blocks
    (codegen/cpu/prelude.py, ``TRANSPOSE_PRELUDE``)."""

    src: Region
    dst: Region


@dataclass(frozen=True, slots=True)
class LaneTaps(Stmt):
    """A depthwise convolution's taps over vectors of channels, on a host without blocks:
    ``out[r * width + c, j] = sum over t of x[r * row_step + c * col_step + offsets[t], j]
    * w[t, j]`` for ``r < rows``, ``c < width`` and every lane ``j`` (the buffers' last
    dim, alike for all three), summed in tap order. ``x`` holds the tile's input rows as a
    zero-padded grid of channel vectors, ``offsets`` each tap's position in it
    (``conv_rows.depthwise_lanes_tile``); the host runs it with a row of positions' sums
    in registers (codegen/cpu/prelude.py, ``TRANSPOSE_PRELUDE``)."""

    x: Buffer
    w: Buffer
    out: Buffer
    rows: int
    width: int
    row_step: int
    col_step: int
    offsets: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PlaneTaps(Stmt):
    """A depthwise convolution's taps over channel planes read where they lie, on a host
    without blocks: ``out[j, r * width + c] = sum over taps (ty, tx), in tap order, of
    w[j, ty * kw + tx] * x[image, channel0 + j, iy, ix]`` with ``iy = (row0 + r) * sy + ty
    * dy - top`` and ``ix = c * sx + tx * dx - left``, zero outside x's [H, W] plane (its
    padding), for ``j`` < w's rows, ``r < rows`` and ``c < width``. The host copies each
    input row a channel's output rows read once, split by column phase and zero padded,
    into a ring of rows on its stack, and sums a row's positions a few vectors at a time
    over the taps (codegen/cpu/prelude.py, ``PLANE_TAPS_PRELUDE``): no padded copy of the
    tile (``conv_rows.depthwise_planes``)."""

    x: Buffer
    image: Expr
    channel0: Expr
    w: Buffer
    out: Buffer
    row0: Expr
    rows: int
    width: int
    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    pads: tuple[int, int]  # top, left


# Winograd's minimal filtering F(4 x 4, 3 x 3) (Lavin and Gray, 2016): an output tile
# Y = A^T [(G g G^T) * (B^T d B)] A of a 6 x 6 input patch d and a 3 x 3 filter g
WINOGRAD_TILE = 4  # output rows and columns a tile
WINOGRAD_BT = ((4, 0, -5, 0, 1, 0), (0, -4, -4, 1, 1, 0), (0, 4, -4, -1, 1, 0),
               (0, -2, -1, 2, 1, 0), (0, 2, -1, -2, 1, 0), (0, 4, 0, -5, 0, 1))
WINOGRAD_G = ((1 / 4, 0, 0), (-1 / 6, -1 / 6, -1 / 6), (-1 / 6, 1 / 6, -1 / 6),
              (1 / 24, 1 / 12, 1 / 6), (1 / 24, -1 / 12, 1 / 6), (0, 0, 1))
WINOGRAD_AT = ((1, 1, 1, 1, 1, 0), (0, 1, -1, 2, -2, 0), (0, 1, 1, 4, 4, 0), (0, 1, -1, 8, -8, 1))


@dataclass(frozen=True, slots=True)
class Winograd(Stmt):
    """A 3 x 3 convolution (unit strides and dilations, one group) of a block of output
    rows by Winograd's minimal filtering F(4 x 4, 3 x 3), on a host without blocks:
    ``c[k, r * width + q] = sum over (ch, a, b) of g[k0 + k, ch, a, b] * x[image, ch, row0
    + r + a, col0 + q + b]`` for ``k`` < c's rows, ``r < rows``, ``q < width``, elements
    outside ``x`` [N, C, H, W] reading zero (its padding). The filter ``g`` comes
    transformed, G g G^T per (output, input) channel, in the order the products read it:
    ``u[Cout / n, C / k_chunk, 36, n, k_chunk]`` for blocks of ``n`` (c's rows) output
    channels, of which ``k0`` starts one (``conv_winograd.weight``). The rows and columns are cut into 4 x 4 tiles (those past
    ``rows`` and ``width`` computed, not stored); each tile's 6 x 6 input patch of a
    channel becomes B^T d B in ``v[36, k_chunk, tiles]``, ``k_chunk`` channels at a time;
    ``m[36, c's rows, tiles]`` sums the 36 products of ``u`` by ``v`` over the channels
    (the host's tap product core); each tile's outputs are A^T m A. Four times fewer
    multiplications than the convolution's, at a rounding error a few times its
    (``conv_winograd``); the host runs it in ``WINOGRAD_PRELUDE`` (codegen/cpu/prelude.py)."""

    x: Buffer
    image: Expr
    row0: Expr  # x's row under the block's first output row's first tap (the block's row - top padding)
    col0: int  # x's column under the first output column's first tap (- left padding)
    u: Buffer
    k0: Expr  # the first output channel, u's row
    v: Buffer
    m: Buffer
    c: Buffer
    rows: int
    width: int

    @property
    def tiles(self) -> tuple[int, int]:
        """The block's tile rows and tile columns."""
        return -(-self.rows // WINOGRAD_TILE), -(-self.width // WINOGRAD_TILE)


def transpose_dims(r: Region) -> tuple[int, int, int]:
    """A Transpose region's (row dim, rows, columns): its first non-unit dim before the
    last (the one before the last where there is none), and the elements of the dims
    after it, one run a row where ``transpose_rows_are_runs`` holds (a 1 x 1 convolution's
    input channels as rows of whole H x W planes: [1, C, H, W] -> C rows of H * W)."""
    dims = [d for d, e in enumerate(r.extents[:-1]) if e != 1]
    row = dims[0] if dims else len(r.extents) - 2
    return row, r.extents[row], math.prod(r.extents[row + 1:])


def transpose_rows_are_runs(r: Region) -> bool:
    """Whether a region's rows (``transpose_dims``) each lie in one run of its buffer: every
    dim after the row dim is of unit extent but the last, or the dims after the first such
    non-unit one are whole."""
    row = transpose_dims(r)[0]
    inner = [d for d in range(row + 1, len(r.extents) - 1) if r.extents[d] != 1]
    return not inner or all(r.extents[d] == r.buffer.shape[d] for d in range(inner[0] + 1, len(r.extents)))


@dataclass(frozen=True, slots=True)
class TapGemm(Stmt):
    """``c += A @ B`` on a host without blocks, row ``p`` of B read at a constant offset of
    one on-chip buffer: ``B[p, q] = b.flat[offsets[p] + q]`` for ``q`` over ``c``'s columns.
    ``a`` is ``c``'s rows of A read where they lie (a region of unit extents but its last
    two dims: rows, then ``len(offsets)`` K columns). A convolution from its input rows
    copied zero-padded on chip (``conv_rows.direct``): K runs over (channel, taps), and a
    tap's row of B is the channel's padded rows shifted by the tap's offset, so the product
    reads its input once from the copy, with no im2col tile. The host's register-blocked
    core (codegen/cpu/prelude.py, ``TAP_PRELUDE``) runs it."""

    a: Region
    b: Buffer
    offsets: tuple[int, ...]
    c: Buffer


@dataclass(frozen=True, slots=True)
class ReduceTile(Stmt):
    """Reduce a 2-D tile ``src`` along ``dim`` into the 1-D ``dst``; with ``clear`` False
    the result is combined with what ``dst`` holds (running reductions)."""

    src: Buffer
    dst: Buffer
    fn: ReduceFn
    dim: int
    clear: bool = True
    # threads that share one kept index's reduction on a device with blocks (their partials
    # meet in shared memory), as tile_ir/passes/lanes.py chose them; 1: one thread per index
    lanes: int = 1
    # on a device with blocks: folded in registers by TileLang's tile reduction, both tiles
    # register fragments (tile_ir/passes/placement.py); False: through shared memory
    registers: bool = False


@dataclass(frozen=True, slots=True)
class If(Stmt):
    """Run ``body`` only where ``cond`` (a bool index expression) holds. The condition is
    uniform over a tile: it may read block variables and serial loop variables, never a
    parallel loop's (every thread of a tile takes the same branch)."""

    cond: Expr
    body: tuple[Stmt, ...]


@dataclass(frozen=True, slots=True)
class Piece:
    """A rectangle of a global output that a staged store copies out: the staging tile's
    columns (rows, for a transposed tile) ``first`` to ``first + width``, written to
    ``region``, per output dim an offset and its extent, or None for a fixed index
    (``tile_ir.nests.rectangle``)."""

    first: int
    width: int
    region: tuple[tuple[Expr, int | None], ...]


@dataclass(frozen=True, slots=True)
class Staging:
    """How an epilogue nest of two loops stores a register accumulator's results to a
    global output (tile_ir/passes/epilogues.py): each thread computes its own elements into
    a shared tile of the output's type, (first loop, second loop) in shape, its rows padded
    by ``pad`` elements (bank conflicts), and the tile is copied out in ``pieces`` with
    whole-line vector stores. ``transposed``: the nest runs (columns, rows) of the
    accumulator, which each thread reads in the accumulator's order, and the tile holds
    [column, row], copied out along its rows."""

    pieces: tuple[Piece, ...]
    transposed: bool = False
    pad: int = 0


class LoopKind(enum.Enum):
    SERIAL = "serial"
    PARALLEL = "parallel"  # iterations are independent: vectorised / spread over threads
    PIPELINED = "pipelined"  # serial, with copies in the body overlapped ``stages`` deep


@dataclass(frozen=True, slots=True)
class Loop(Stmt):
    var: Var
    extent: int
    kind: LoopKind
    body: tuple[Stmt, ...]
    stages: int = 0
    # the serial loop of a running fold ``b[i] = f(b[i], term)`` in a parallel nest, split
    # over this many threads per parallel index on a device with blocks (each folds every
    # lanes-th term; tile_ir/passes/lanes.py); 1: one thread folds them all
    lanes: int = 1
    # the head of a parallel nest that stores an accumulator's results through a shared
    # tile (tile_ir/passes/epilogues.py); None: element by element
    staging: Staging | None = None


@dataclass(frozen=True, slots=True)
class Residency:
    """What a GPU kernel asks of its compiler for ``blocks`` of it resident on one core (a
    register bound per thread; 1: the compiler's default), and for a producer-loaded kernel
    the register budgets of its warp roles that fit them (0: the toolchain's defaults), as
    tile_ir/passes/pipelines.py chose them."""

    blocks: int = 1
    producer_registers: int = 0
    consumer_registers: int = 0


@dataclass(frozen=True, slots=True)
class TileProgram:
    """One kernel. ``params`` are the global buffers, inputs first, then outputs
    (``num_inputs`` of them are inputs). Each of the ``grid`` tiles runs ``body`` with
    ``block_vars`` bound to its coordinates; ``allocs`` are per-tile buffers."""

    name: str
    params: tuple[Buffer, ...]
    num_inputs: int
    grid: tuple[int, ...]
    block_vars: tuple[Var, ...]
    threads: int
    allocs: tuple[Buffer, ...]
    body: tuple[Stmt, ...]
    notes: tuple[str, ...] = field(default=())  # the schedule's choices, for people
    # tiles the schedule wants resident on one core at once (GPU: blocks per SM, a register
    # bound for the compiler); 0: the code generator's default
    occupancy: int = 0
    # the K loop's operand tiles are loaded by a producer ahead of the products (GPU: TMA and
    # a warp-specialised pipeline, where every pipelined load is a plain tile copy)
    producer: bool = False
    # IndexCheck sites in the body; above 0 the kernel takes the status word STATUS as an
    # argument after its params
    index_sites: int = 0
    # what the lowering chose, as one record of its pattern's family (tile_ir/schedule.py):
    # printed above the program and saved in the plan, never emitted into a kernel; None
    # only for programs built by hand (lower_group gives every group's program one)
    schedule: Schedule | None = None
    # the threads the lowering asked for, where the thread fitting pass narrowed the block
    # to split every parallel nest evenly (tile_ir/passes/threads.py); 0: not narrowed
    fitted_from: int = 0
    # fragment tiles held in registers (the rest of the fragment tiles live in shared
    # memory), as the register placement pass found them for ``threads`` on a device with
    # blocks (tile_ir/passes/placement.py); empty elsewhere
    registers: frozenset[str] = frozenset()
    # threads per row of a row program laid out as whole warps per row (registers and warp
    # shuffles, no tile), as tile_ir/passes/rows.py found it; 0: the block-wide form
    row_lanes: int = 0
    # whether the pipelined loops load through TMA with a warp-specialised producer (GPU;
    # else cp.async), and the blocks a core keeps resident (tile_ir/passes/pipelines.py)
    tma: bool = False
    residency: Residency = Residency()
    # the order a host nests the grid's axes in, outermost first (indices into ``grid``);
    # empty: as given. The tiles are independent: the order only decides which operand
    # tiles stay in a core's cache from one tile to the next, and how a static schedule
    # splits the tiles between threads (codegen/cpu/emit.py)
    host_order: tuple[int, ...] = ()

    @property
    def inputs(self) -> tuple[Buffer, ...]:
        return self.params[: self.num_inputs]

    @property
    def outputs(self) -> tuple[Buffer, ...]:
        return self.params[self.num_inputs :]


# The status word of a kernel with index checks: int64 [site + 1 of an index found out of
# range (0: none), that index's value]. Kernels write it only on an error, so the runtime
# zeroes it once and reads it after a run; of several bad indices one is kept.
STATUS = Buffer("status", DType.INT64, (2,), Scope.GLOBAL)


# -- small constructors used by lowering --------------------------------------------------
def const_index(v: int) -> Const:
    return Const(int(v), DType.INT64)


def iop(op: IOp, a: Expr | int, b: Expr | int) -> Expr:
    """Index arithmetic with constant folding of the trivial cases."""
    a = const_index(a) if isinstance(a, int) else a
    b = const_index(b) if isinstance(b, int) else b
    if isinstance(a, Const) and isinstance(b, Const) and op in _FOLD:
        return const_index(_FOLD[op](int(a.value), int(b.value)))
    if op is IOp.ADD and _is(b, 0) or op is IOp.SUB and _is(b, 0):
        return a
    if op is IOp.ADD and _is(a, 0):
        return b
    if op is IOp.MUL and (_is(b, 1) or _is(a, 0)):
        return a
    if op is IOp.MUL and (_is(a, 1) or _is(b, 0)):
        return b
    if op is IOp.FLOORDIV and _is(b, 1):
        return a
    if op is IOp.MOD and _is(b, 1):
        return const_index(0)
    return IndexOp(op, a, b)


def _is(e: Expr, v: int) -> bool:
    return isinstance(e, Const) and e.value == v


_FOLD: dict[IOp, Callable[[int, int], int]] = {
    IOp.ADD: lambda a, b: a + b,
    IOp.SUB: lambda a, b: a - b,
    IOp.MUL: lambda a, b: a * b,
    IOp.FLOORDIV: lambda a, b: a // b,
    IOp.MOD: lambda a, b: a % b,
    IOp.MIN: min,
    IOp.MAX: max,
}


_BOOL_IOPS = frozenset({IOp.LT, IOp.LE, IOp.GE, IOp.EQ, IOp.AND, IOp.OR})


def children(e: Expr) -> tuple[Expr, ...]:
    """The expressions directly inside ``e``."""
    if isinstance(e, IndexOp):
        return (e.a, e.b)
    if isinstance(e, Load):
        return e.indices
    if isinstance(e, Call):
        return e.args
    if isinstance(e, IndexCheck):
        return (e.index,)
    return ()


def subexpressions(e: Expr) -> Iterator[Expr]:
    """``e`` and every expression inside it."""
    stack = [e]
    while stack:
        x = stack.pop()
        yield x
        stack.extend(children(x))


def statements(stmts: tuple[Stmt, ...] | list[Stmt]) -> Iterator[Stmt]:
    """Every statement, loops' and branches' bodies included, in order."""
    for s in stmts:
        yield s
        if isinstance(s, (Loop, If)):
            yield from statements(s.body)


def substitute(e: Expr, env: dict[Var, Expr]) -> Expr:
    """``e`` with each variable of ``env`` replaced by its expression."""
    if isinstance(e, Var):
        return env.get(e, e)
    if isinstance(e, IndexOp):
        return iop(e.op, substitute(e.a, env), substitute(e.b, env))
    if isinstance(e, Load):
        return Load(e.buffer, tuple(substitute(i, env) for i in e.indices))
    if isinstance(e, Call):
        return Call(e.fn, tuple(substitute(a, env) for a in e.args), e.dtype)
    if isinstance(e, IndexCheck):
        return IndexCheck(substitute(e.index, env), e.extent, e.site)
    return e


def map_loads(e: Expr, fn: Callable[[Load], Expr]) -> Expr:
    """``e`` with each load (indices mapped first) replaced by ``fn`` of it."""
    if isinstance(e, Load):
        return fn(Load(e.buffer, tuple(map_loads(i, fn) for i in e.indices)))
    if isinstance(e, IndexOp):
        return IndexOp(e.op, map_loads(e.a, fn), map_loads(e.b, fn))
    if isinstance(e, Call):
        return Call(e.fn, tuple(map_loads(a, fn) for a in e.args), e.dtype)
    if isinstance(e, IndexCheck):
        return IndexCheck(map_loads(e.index, fn), e.extent, e.site)
    return e


def dtype_of(e: Expr) -> DType:
    """The scalar type of an expression: index arithmetic is int64 (comparisons bool)."""
    if isinstance(e, (Const, Call)):
        return e.dtype
    if isinstance(e, Load):
        return e.buffer.dtype
    if isinstance(e, IndexOp):
        return DType.BOOL if e.op in _BOOL_IOPS else DType.INT64
    return DType.INT64  # Var, IndexCheck
