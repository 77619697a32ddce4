"""Schedule records: what a lowering chose for one kernel, as a frozen value.

A lowering (``tile_ir/lower/``) decides a kernel's tiles, threads, pipeline depth and a
few flags from its match, the device and its pattern's policy. Those choices were spread
over the program (``threads``, ``occupancy``, ``producer``, loop stages, buffer shapes)
and a line of notes for people; here they are one record per pattern family, carried by
the program (``TileProgram.schedule``), printed above it by the tile-IR printer and saved
per kernel in a plan's manifest. A record describes decisions already made: nothing reads
it to build code (the emitters print the program, and never the record, so kernels and
their names do not depend on it). Later steps move the emitters' own decisions into it and
let measured selection enumerate candidate records.

Two kinds of sizes appear. Tile edges, threads and stages are chosen numbers and stay
``int``. Problem extents (a product's rows, a sequence, a tensor's shape) are ``Extent``:
``int`` today, and the one place a later change may put a ``Sym`` — a size known only at
run time, within a range — so that dynamic batch or sequence can keep the tiles fixed and
compute grids and last-tile bounds when the kernel is launched. Nothing produces a
``Sym`` yet.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar, Union

from tilefuse.ir.dtypes import DType


@dataclass(frozen=True, slots=True)
class Sym:
    """A problem extent fixed only at run time, somewhere in ``[lo, hi]`` (e.g. a
    sequence length up to the model's context). Declared for the records' typing; no
    lowering makes one yet."""

    name: str
    lo: int
    hi: int

    def __post_init__(self) -> None:
        if not 0 <= self.lo <= self.hi:
            raise ValueError(f"symbol {self.name}: range [{self.lo}, {self.hi}] is empty or negative")

    def __str__(self) -> str:
        return f"{self.name}[{self.lo}..{self.hi}]"


# A problem extent in a record: ``int`` today; ``Union[int, Sym]`` once a lowering can
# schedule a run-time size (every consumer of records is written against this name).
Extent = int
AnyExtent = Union[int, Sym]  # what Extent will widen to


class Schedule:
    """The common face of the records: a family name (the pattern's, ``gemm`` ...), the
    threads of a tile (equal to the program's: ``tile_ir.verify`` checks it), and a JSON
    form for the plan."""

    __slots__ = ()
    family: ClassVar[str]
    threads: int

    def to_json(self) -> dict[str, object]:
        """``{"family": ..., field: value, ...}`` with scalars and (nested) lists only:
        dtypes as their names, tuples as lists."""
        out: dict[str, object] = {"family": self.family}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            out[f.name] = _json(getattr(self, f.name))
        return out

    def with_threads(self, threads: int) -> "Schedule":
        """The same record for a block of ``threads`` (the thread fitting pass)."""
        return dataclasses.replace(self, threads=threads)  # type: ignore[type-var]

    def describe(self) -> str:
        """One line for people: the family, then each field as ``name=value``."""
        parts = []
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if isinstance(v, tuple):
                v = "x".join(map(str, v)) if all(not isinstance(x, tuple) for x in v) else \
                    ",".join("x".join(map(str, x)) for x in v)
                v = v or "()"
            elif isinstance(v, str) and f.name == "reason":
                v = repr(v)
            parts.append(f"{f.name}={v}")
        return f"{self.family}: {' '.join(parts)}"


def _json(v: object) -> object:
    if isinstance(v, tuple):
        return [_json(x) for x in v]
    if isinstance(v, DType):
        return str(v)
    if isinstance(v, Sym):  # a scalar, as a plan's manifest takes only scalars and lists
        return str(v)
    return v


@dataclass(frozen=True, slots=True)
class GemmSchedule(Schedule):
    """A tiled product (MatMul, or a convolution as implicit GEMM) with its epilogue
    (``lower/gemm_epilogue.py``): ``[batch..., m, n] = [m, k] @ [k, n]`` in tiles of
    ``tile_m x tile_n``, a K loop of ``tile_k`` deep steps ``stages`` deep."""

    family: ClassVar[str] = "gemm"
    batch: tuple[Extent, ...]
    m: Extent
    n: Extent
    k: Extent
    tile_m: int
    tile_n: int
    tile_k: int
    threads: int
    stages: int
    products: int  # sibling products in the kernel (1: a single product)
    packed_siblings: bool  # siblings as one product of their weights side by side
    chain: bool  # a weight chain: the first product computed tile_k columns at a time on chip
    whole_rows: bool  # tiles of whole rows (tile_n == n) for the epilogue's row reductions
    producer: bool  # operand tiles loaded by a producer ahead of the products (sm_90a: TMA)
    channel_rows: bool  # a convolution tiled as output channels x positions (conv_rows.py)
    depthwise: bool  # a depthwise convolution, a few channels per tile
    channels_per_k_tile: int  # a convolution's whole input channels per K tile; 0: no convolution
    padded_columns: int  # the weight bound padded to this many columns (whole column tiles); 0: not
    accumulator: DType
    operands: DType  # the operand tiles' type (half for tensor cores, else the accumulator's)
    tf32: bool  # float32 operands may round to TF32
    occupancy: int  # tiles asked to be resident per core; 0: the code generator's default
    # a convolution's im2col tile filled along positions: neighbouring threads read
    # neighbouring input positions (ConvPolicy.positions_inner)
    positions_inner: bool = False
    # a grouped convolution's groups (1: none, or depthwise): n and k are all groups' output
    # channels and one group's input channels x taps, and each column tile lies inside a group
    groups: int = 1
    # on a host: the constant weight bound packed in panels of this many columns, A's rows
    # read in place, K walked tile_k rows at a time (lower/panels.py); 0: operand tiles
    panel_width: int = 0
    # a depthwise convolution computed from its input rows copied zero-padded on chip, each
    # this many wide (per column phase of a strided one), every tap summed per position along them (conv_rows.depthwise_padded);
    # 0: tap by tap over runs of output rows
    depthwise_padded_width: int = 0
    # on a host: a depthwise convolution summed over its input's channel planes where they
    # lie, each input row copied once into a ring of padded rows (conv_rows.depthwise_planes_tile)
    depthwise_planes: bool = False
    # a depthwise convolution with this many channels in vector lanes, from its input rows
    # copied into a zero-padded grid of channel vectors (conv_rows.depthwise_lanes_tile)
    depthwise_lanes: int = 0
    # on a host: a pointwise convolution with channels as rows reads its weight's rows and
    # its input's channel planes where they lie, no operand tiles (conv_rows.in_place)
    operands_in_place: bool = False
    # on a host: a convolution computed K step by K step from its input rows copied
    # zero-padded on chip, this many wide (per column phase), its products' rows that far
    # apart in the tile (conv_rows.direct_product); 0: an im2col tile per K step
    direct_padded_width: int = 0
    # on a host: a 3 x 3 convolution by Winograd's minimal filtering with output tiles this
    # many positions on a side (conv_winograd.py: 4, F(4 x 4, 3 x 3)); 0: not
    winograd: int = 0


@dataclass(frozen=True, slots=True)
class AttentionSchedule(Schedule):
    """Flash-style attention (``lower/attention.py``): per tile of ``query_tile`` queries,
    key/value tiles of ``key_tile`` stream through an online softmax."""

    family: ClassVar[str] = "attention"
    batch: tuple[Extent, ...]
    queries: Extent
    keys: Extent
    head_dim: int
    value_dim: int
    query_tile: int
    key_tile: int
    threads: int
    stages: int  # of the key loop; 0: a serial loop (exact float32 products on a GPU)
    occupancy: int  # tiles resident per core for one wave; 0: not asked (K/V loads pipelined)
    operands: DType  # Q, K, V and P tiles (half-float with tensor cores, else float32)
    tf32: bool


@dataclass(frozen=True, slots=True)
class RowsSchedule(Schedule):
    """Row reductions, norms and elementwise chains (``lower/rows.py``): ``rows`` rows of
    ``width`` in tiles of ``rows_per_tile`` whole rows (rows longer than the policy's
    ``max_row``: one row a tile, walked ``chunk`` columns at a time)."""

    family: ClassVar[str] = "rows"
    rows: Extent
    width: Extent
    rows_per_tile: int
    threads: int
    reductions: int
    # threads a row was sized for (whole warps of threads // rows_per_tile lanes dividing
    # the row: the one-warp-per-row form); 0: no such tile, or no warps
    lanes_per_row: int
    occupancy: int  # tiles resident per core at once; 0: the code generator's default
    chunk: int = 0  # columns per chunk of a row longer than the policy's max_row; 0: whole rows


@dataclass(frozen=True, slots=True)
class WindowsSchedule(Schedule):
    """Pooling and global reductions (``lower/windows.py``): tiles of ``tile`` over the
    reduction's ``shape``, one output element a thread, each folding ``taps`` terms."""

    family: ClassVar[str] = "windows"
    shape: tuple[Extent, ...]
    tile: tuple[int, ...]
    taps: tuple[int, ...]
    threads: int


@dataclass(frozen=True, slots=True)
class ScatterSchedule(Schedule):
    """A scatter whose blocks own output tiles (``lower/scatter.py``): the output seen as
    ``rows x width`` (ScatterND: the indexed positions x the elements one update writes;
    ScatterElements: every other position x the scattered axis), tiles of ``tile``, each
    block scanning ``updates`` updates (ScatterND: all of them, in order; ScatterElements:
    those of its own rows) and applying the ones that land in its tile."""

    family: ClassVar[str] = "scatter"
    form: str  # "nd" or "elements"
    rows: Extent
    width: Extent
    updates: Extent
    tile: tuple[int, int]
    reduction: str
    threads: int
    per_element: bool = True  # ScatterElements: each element's thread takes its updates (else each row's thread)


@dataclass(frozen=True, slots=True)
class StagedSchedule(Schedule):
    """The fallback (``lower/staged.py``): one tile of one thread computing the group in
    stages over on-chip scratch; ``reason`` says why no specialised pattern applied."""

    family: ClassVar[str] = "staged"
    reason: str
    buffers: int
    scratch_bytes: int
    product_tiles: tuple[tuple[int, int, int], ...]  # (rows, columns, K) of each tiled product stage
    threads: int


FAMILIES: dict[str, type[Schedule]] = {
    cls.family: cls for cls in (GemmSchedule, AttentionSchedule, RowsSchedule, WindowsSchedule, ScatterSchedule,
                                 StagedSchedule)
}
