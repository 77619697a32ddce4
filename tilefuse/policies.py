"""Schedule policies as data: per pattern, the choices a lowering makes that the hardware
does not dictate (tile edges, threads a tile takes, when to stop growing a group).

Each policy is a frozen dataclass holding today's defaults, with the measurement that chose
them; a target holds one of each (tilefuse/target.py). Nothing here is read from module
state: a benchmark builds a variant with ``dataclasses.replace`` (``tilefuse.target.adjust``)
and the plan records the policies it was built with, so a plan says how it was scheduled.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GemmPolicy:
    """Contraction tiles: plain products, products with epilogues, chains and convolutions
    as implicit GEMM (tile_ir/lower/gemm_epilogue.py)."""

    row_tile: int  # rows of a contraction tile when an epilogue needs whole rows
    tile_k: int = 256  # K depth of a contraction tile (operand tiles are rows x tile_k, tile_k x cols)
    min_tile: int = 64  # smallest tile edge the lowering shrinks to where a grid would leave cores idle
    tile: int = 64  # edge of a plain contraction tile before shrinking for parallelism
    rows: int = 0  # its rows where they differ from ``tile`` (0: the same)
    max_threads: int = 128  # threads of a tile's block (GPU; a 128x128 product tile takes two warpgroups)
    accumulator_bytes: int = 1 << 30  # accumulators one plain product tile may hold (GPU: registers)
    inflight_bytes: int = 0  # operand bytes a small product tile keeps loading ahead (GPU); 0: 2 stages of tile_k
    half_operand_tiles: bool = False  # half-float products keep operand tiles half (tensor cores)
    # sibling products (Q, K, V) run as one product of their weights packed side by side,
    # each column tile running its own sibling's epilogue (GPU: one full-size accumulator
    # instead of one per sibling); else the siblings share the A tile, one accumulator each
    pack_siblings: bool = False
    # large plain half-float products take ``producer_tile`` tiles (rows, columns) whose operand
    # loads a producer warp issues ahead of the matrix unit (sm_90a: TMA, warp-specialised,
    # one block a core), where each core then runs at least ``producer_steps`` K steps of
    # them (the pipeline's fill and drain amortised); 0: never
    producer_steps: int = 0
    producer_tile: tuple[int, int] = (128, 256)
    # product tile edges forced where they divide the product (None: the schedule's own);
    # for measuring schedules (benchmarks/gpu_gemm.py variants bmM / bnN), not a user setting
    force_tile_m: int | None = None
    force_tile_n: int | None = None
    # on a host without blocks: a plain float32 product by a constant weight binds the
    # weight packed in panels of this many columns and reads A in place (lower/panels.py);
    # 0: operand tiles
    panel_width: int = 0
    # ... and where the nearest tile of whole panels leaves a partial last one or cores
    # with fewer tiles than others, takes the width whose grid costs least, its
    # accumulators within this many bytes (panels.column_tile; 0: the nearest tile);
    # a convolution's column tile counts as this many columns more (its A tile filled
    # again: 3-4 columns' work by hand, NOTES.md session 35)
    panel_grid_bytes: int = 0
    panel_fill_columns: int = 4
    # on a host: an output stored across the tile (its contiguous axis along the tile's
    # rows: a convolution with positions as rows, written per channel) whose epilogue
    # calls a function of at least this many flops an element (ScalarFn flops: exp 8, a
    # SiLU's sigmoid 10, a GELU's erf 16) is computed in the tile's own order into a
    # staging tile, vectorised along its columns, then copied out; 0: computed in the
    # store's order (a strided read per element, no vector math: EfficientNet's 7 x 7
    # expansions spent 60% of their time so). Cheap epilogues (a norm, a residual) keep
    # the store's order: the copy would cost what the vectors save (MobileNetV2's 7 x 7
    # projection with its residual: 0.19 ms so, 0.21 staged)
    staged_epilogue_flops: int = 0
    # ... and so is one that selects (max, min, where: ReLU, Clip), whatever its flops: in
    # the store's order the compiler leaves it scalar, a branch an element, which data of
    # both signs mispredicts (MobileNetV2's 7 x 7 ReLU6 expansions, 160 -> 960 channels:
    # 0.46-0.50 ms so, 0.16 staged; NOTES.md, session 32)
    staged_epilogue_selects: bool = False
    # ... or, before either, any such epilogue reads the float32 accumulator tile turned by
    # the host's block transpose (Transpose) into the store's order: the math in vectors and
    # the residual read as runs, for one pass of 16 x 16 blocks (MobileNetV2's 7 x 7
    # layers: 1-5% each against the staging tile or the store's order; NOTES.md, session 32)
    turned_epilogue: bool = False
    # quantized (QDQ) products by constant 8-bit weights run as integer products, summed
    # exactly in int32 and rescaled in float (frontend/qdq.py), instead of on dequantized
    # floats; a host's u8 x s8 ones read packed panels of int8 values (lower/panels.py)
    integer_products: bool = False

    def row_epilogue_bytes(self, row_elems: int) -> int:
        """On-chip bytes for a tile of whole fp32 accumulator rows of ``row_elems``."""
        return self.row_tile * row_elems * 4


@dataclass(frozen=True, slots=True)
class AttentionPolicy:
    """Flash-style attention tiles (tile_ir/lower/attention.py)."""

    max_head_dim: int  # largest head dim a flash-style tile keeps on chip
    query_tile: int = 64  # query rows of a tile before fill_cores shrinks it
    key_tile: int = 64  # keys per step of the online softmax
    # a host's key tiles that do not divide the keys: edges rounded up to a multiple of this
    # (whole vectors of scores a row, tile_ir/lower/attention.py ``_edge``)
    key_align: int = 1
    # Where the grid is a few waves of tiles (bert-base b32: 768 tiles, 4 resident per SM by
    # registers and shared memory: 1.45 waves), ask for as many resident per SM as one wave
    # needs, up to this many, with K/V loads unpipelined to make room (short key loops).
    # Off (0): at 6 a SM the kernel spilled (80 registers) and ran 31 us against 22 (NOTES).
    one_wave_occupancy: int = 0


@dataclass(frozen=True, slots=True)
class RowsPolicy:
    """Row reductions and normalisations (tile_ir/lower/rows.py)."""

    tile_elems: int = 8192  # br x E of one reduction tile: 32 KB of fp32
    max_row: int = 16384  # longer rows: one row a tile, walked in chunks of at most tile_elems
    max_resident: int = 4  # row tiles a GPU core is asked to hold at once: 256 threads x 64 registers each
    threads: int = 256  # threads of a row tile's block (GPU; bert-base b32 norms 15 -> 14 us against 128)
    # a reduction to fewer outputs than cores is split in two (partition/split_reductions.py)
    # where its length has a divisor leaving parts of at least this many terms; 0: never
    split_part: int = 0
    split_row: int = 1 << 18  # and, where it keeps a row axis, from this many terms
    split_parts: int = 256  # parts of one output at most
    # a reduction over leading axes (its last axis kept: a window, one thread an output) to
    # fewer outputs than this is split along its first reduced axis, in place, until it has
    # about this many (0: never): 512 column sums over 4,096 rows ran on 512 GPU threads
    split_window_outputs: int = 0
    split_window_terms: int = 32  # terms one part of such a split folds at least
    # and only from this many terms an output: a shorter fold (sbert's mean over 128 tokens)
    # costs about what the second kernel's launch would
    split_window_length: int = 1024


@dataclass(frozen=True, slots=True)
class ConvPolicy:
    """How convolutions are laid out as products (tile_ir/lower/conv_rows.py)."""

    # tiles as [out channels x positions] (weights x im2col^T): NCHW outputs are stored
    # along positions, im2col rows are runs of input rows (CPU); else [positions x channels]
    channel_rows: bool = False
    min_positions: int = 64  # output positions per image below which channels stay columns
    depthwise_channels: int = 8  # channels per depthwise tile
    # output positions of a depthwise tile of output rows at most (0: as any other
    # convolution's, 256): a whole plane reads each input plane as one run, where tiles of
    # 2-4 rows read runs of 224-448 bytes that the prefetcher barely follows (MobileNetV2
    # 0.977, EfficientNet-B0 0.982 at 4096 with 4 channels against 256 with 8; NOTES.md, session 32)
    depthwise_positions: int = 0
    # a depthwise convolution over 2-D maps computed from a zero-padded copy of its input
    # rows on chip (split by stride phase), every tap summed per position in one loop along
    # the padded rows (conv_rows.depthwise_padded) whose length is a multiple of this many positions,
    # so it runs in whole vectors; 0: tap by tap over runs of each output row (EfficientNet's
    # 5 x 5 taps over 7-wide maps were runs of 5-7: 7-10x the bandwidth floor)
    depthwise_run: int = 0
    # such a convolution's output rows at least this wide are left where the sums put them,
    # ``padded_width`` apart, and the epilogue reads them there; narrower ones are packed
    # into whole runs of positions first: the epilogue then runs along a channel's plane
    # (EfficientNet's 7 x 7 maps with SiLU: 1.5-2.4x slower row by row, MobileNetV2's 56 x 56
    # ones 0.85 of their time without the pass)
    depthwise_pitch_width: int = 32
    # ... and narrower ones computed with this many channels in vector lanes (0: never),
    # their input copied into a zero-padded grid of channel vectors (conv_rows.depthwise_lanes),
    # where strided or of at least ``depthwise_lanes_taps`` taps: EfficientNet's 5 x 5 ones
    # took 0.43-0.94 of their time, strided 3 x 3 ones 0.65-0.80; unstrided 3 x 3 ones
    # 0.85-1.23 (their two turns cost about what nine taps do)
    depthwise_lanes: int = 0
    depthwise_lanes_taps: int = 25
    # ... their epilogue computed in the lanes where it reads nothing a position but the
    # sums, and the tile stored by one transpose (conv_rows.lanes_epilogue), not turned
    # back to channel rows first: EfficientNet's 5 x 5 ones over 7 x 7 and 14 x 14 0.91
    # (where the kernels have AVX-512's block transpose: conv_rows.has_avx512)
    lanes_epilogue: bool = False
    # such convolutions over wider rows, of at least this column stride (0: none), summed
    # over their input planes where they lie (conv_rows.depthwise_planes_tile: a ring of
    # padded input rows on the host's stack, of at most ``depthwise_planes_ring`` bytes; with
    # AVX-512, unit strides read the rows in place, lanes past their ends masked), not from a
    # padded copy of the tile. Stride 2: MobileNetV2 0.986, EfficientNet-B0 0.975; unstrided
    # ones through the ring 0.997-1.013 and 0.979, read in place MobileNetV2 0.974 / 0.945 (1 /
    # 2 threads), EfficientNet-B0 0.952 / 0.962 (NOTES.md, session 34)
    depthwise_planes: int = 0
    depthwise_planes_ring: int = 32768
    # ... unstrided ones from rows this wide where the helper reads them in place (AVX-512
    # kernels; 0: ``depthwise_pitch_width``): rows of one vector and more (MobileNetV2's
    # 3 x 3 over 28 x 28 0.82 of the padded tile's time in the model, 14-wide rows
    # 1.08-1.27; through the ring of an x86-64-v3 build 4-8x)
    depthwise_planes_width: int = 0
    # im2col tiles [positions x (channel, taps)] filled with positions as the innermost loop:
    # neighbouring threads read neighbouring input positions of one channel and tap (GPU:
    # coalesced; taps innermost read a warp's 32 values from 32 places, ResNet-50's 3 x 3
    # convolutions at 0.5-14 TFLOP/s)
    positions_inner: bool = False
    # output channels of a convolution tile at most (0: the product tile's edge): each
    # channel tile fills the im2col of its positions again, so fewer, wider ones fill it
    # less often (CPU: ResNet-50's 3 x 3 convolutions of 512 channels refilled it 8 times)
    channel_tile: int = 0
    # output channels of a host's in-place pointwise convolution tile at most (0: as any
    # other), its positions whole planes: its epilogue runs a register block at a time
    # (codegen/cpu/block_epilogues.py), and each of its stores and residual reads is then
    # a run along a plane. More channels a tile, more runs at once: ResNet-50's 56 x 56
    # projection with its residual took 0.69 of its time at 8 channels, 0.88 at 16 and
    # 1.3 at 32, against 128-channel tiles of 4 rows
    in_place_channels: int = 0
    # ... and only over at most this many input channels (and input planes that take at
    # most half the core's cache: every tile reads them): over more, the products hide the
    # epilogue's streams, and wide tiles read the input once (ResNet-50's 1 x 1
    # reductions of 256-1024 channels took 1.3-2.1x as long in 8-channel tiles)
    in_place_max_k: int = 128
    # a host's in-place pointwise convolution's weight bound in the product core's row
    # blocks of its tiles (tile_ir/row_blocks.py: a K step of a register block one run,
    # the tile one stream): ResNet-50's 1024 -> 256 one took 0.8 of its time cold
    row_blocks: bool = False
    # on a host: an ungrouped 2-D convolution with channels as rows computed from its input
    # rows copied zero-padded on chip, each (channel, tap) a row of the product at a
    # constant offset of the copy (conv_rows.direct_product), instead of an im2col tile of
    # taps x positions per K step (ResNet-50's 64-channel 3 x 3 at 56 x 56, by hand: 0.88-0.92
    # of the im2col kernel's time, the copy 1/9 of the im2col tile's size); a pointwise one
    # too where its input planes outgrow the core's cache (conv_rows.direct_width)
    direct: bool = False
    # on a host: an ungrouped 3 x 3 convolution with unit strides computed by Winograd's
    # minimal filtering F(4 x 4, 3 x 3) (conv_winograd.py: four times fewer multiplications,
    # a few times a direct sum's rounding error), over at least ``winograd_min_channels``
    # input and output channels, in blocks of whole output rows of at least
    # ``winograd_min_tiles`` 4 x 4 tiles (the product's columns: a 16-float vector's worth)
    winograd: bool = False
    winograd_min_channels: int = 16
    winograd_min_tiles: int = 16


@dataclass(frozen=True, slots=True)
class WindowPolicy:
    """Pooling windows (tile_ir/lower/windows.py)."""

    tile: int = 256  # output elements of a pooling tile (GPU: one per thread of the block)
    max_threads: int = 128  # threads of its block (GPU)
    # on a host: running values an output element of a reduction along the input's last
    # axis (a global pool) folds it in, one a vector lane (16: one 16-float vector); 0: one
    lanes: int = 0


@dataclass(frozen=True, slots=True)
class ScatterPolicy:
    """Scatters on devices with blocks (tile_ir/lower/scatter.py): each block owns a tile of
    the output and applies, in order, the updates that land in it."""

    tile_elems: int = 4096  # output elements of one tile (16 KB of fp32 in shared memory)
    max_cols: int = 1024  # a ScatterND tile's columns (the elements one update writes) at most
    min_tile_elems: int = 256  # tiles halve towards a grid of one per core down to this (each block scans the updates)
    threads: int = 256  # threads of its block
    # ScatterElements: steps x row width up to which each element's thread compares itself
    # with every step's index (conflict-free, no branch); longer rows: one thread a row
    max_row_compares: int = 1 << 16


@dataclass(frozen=True, slots=True)
class StagedPolicy:
    """The fallback schedule (tile_ir/lower/staged.py): one tile computing the group stage by
    stage."""

    # threads of its block. 1 on every target today: on the GPU, 256 or 32 threads split the
    # stages' nests, but TileLang finds no layout for some of them (a 2 x 48 x 4 depthwise
    # tile vectorised over 128 threads; a 50-element copy on 16), including nests the CUDA
    # printer makes of Copy statements, which the thread fitting pass does not see yet
    # (benchmarks/NOTES.md, session 10)
    threads: int = 1


@dataclass(frozen=True, slots=True)
class PartitionPolicy:
    """Bounds on one fusion group (partition/grow.py)."""

    max_group_nodes: int = 512  # cap that keeps pathological graphs tractable
    # longest path of primitives in one group: the lowering builds each element expression
    # recursively, and a few hundred levels overflow Python's stack (the zoo's deepest is 22)
    max_group_depth: int = 128
