"""Code-generation options as data: switches and budgets of the C and CUDA emitters.

Frozen, carried by the target (``Target.codegen``) and passed to the emitters, so a kernel's
source follows from its program and these alone; a benchmark compares variants by building
targets with other options (``tilefuse.target.adjust``), never by patching a module. This
module imports nothing: every stage may read it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CpuOptions:
    """The C emitter (codegen/cpu/emit.py)."""

    stack_buffer_bytes: int = 64 * 1024  # a tile buffer above this lives on the heap
    stack_total_bytes: int = 256 * 1024  # and so do all buffers past this much stack per tile
    # element operations (MACs, or 8 per store) that pay for a parallel region: about
    # 50-100 us on one core, enough to pay for waking a sleeping pool thread (tens of us).
    # A smaller region gains a few us on an idle machine, but on a busy one each region
    # risks a wait for a descheduled thread, and a thread spinning between such regions
    # takes the caller's core: a 2-thread tiny BERT (kernels of 2x16x64) had a busy-machine
    # p99 of 6.6x its quiet median at 1 << 17 and 1.8x at 1 << 20 (NOTES.md, session 9).
    # A tile grid with less work runs its tiles in turn on the calling thread.
    parallel_min_work: int = 1 << 20
    collapse_min_iters: int = 8  # outer iterations that justify keeping the innermost loop for simd
    # a tile's row reductions (attention's row max and sum) fold each row in this many
    # running values, one a vector lane (16: one 16-float vector), combined at its end
    # (tile_ir/passes/lanes.py); 1: one running value, a chain of dependent operations
    reduction_lanes: int = 16
    # the instruction-set level the kernels are compiled for (tilefuse/cpu_isa.py): "native"
    # (this machine's every extension) or an x86-64 level, "x86-64-v2" / "-v3" / "-v4",
    # for plans that run on other machines (``--cpu-isa``)
    isa: str = "native"
    # a product's epilogue runs per register block (codegen/cpu/block_epilogues.py) on
    # tiles of at most this many rows (0: never): a block's epilogue writes (and reads) a
    # run of each of its rows, and a column of blocks runs down all the tile's rows before
    # the next; over more rows, too many runs at once outrun the hardware's prefetch
    # (ResNet-50's 1 x 1 reductions in tiles of 64-128 channels took 1.1-1.2x as long)
    block_epilogue_rows: int = 24
    # and on tiles of any rows whose product reads at most this much of B (K x the tile's
    # columns, in bytes: it stays in the first-level cache), a row of blocks at a time:
    # the epilogue then writes a few runs at once, each a whole tile row long (MobileNetV2's
    # expansions of 16-32 channels; ResNet-50's reductions above, 64-128 channels deep, read
    # 50-500 KB of B and keep the tile-wide form)
    block_epilogue_b_bytes: int = 32 * 1024
    # an element loop (``omp simd``, stores only, computing exp, erf, a division...) over
    # more than this many elements, whose tail the compiler's vectors of a half and a quarter
    # of this many would leave to scalar code, runs in steps of this many, the last step
    # moved back to end at the loop's end (recomputing a few elements, where the loop reads
    # nothing it writes): EfficientNet's SiLU over 7 x 7 planes, 48 elements in vectors and
    # one through a scalar exp, took a quarter of its depthwise kernel's time (0: never)
    overlap_tail: int = 16


@dataclass(frozen=True, slots=True)
class CudaOptions:
    """The TileLang emitter (codegen/cuda/emit.py, warp_rows.py) and the tile-IR passes that
    decide for it on a device with blocks (tile_ir/passes/, which read the fields that
    ``tile_ir.passes.DeviceOptions`` names)."""

    t_copy: bool = True  # plain tile loads through T.copy (cp.async, pipelined; tile_ir/passes/copies.py)
    # Kernels whose pipelined K loops hold only T.copy tile loads and products may lower with
    # TMA and a warp-specialised producer (TileLang's default on sm_90a); the rest keep
    # cp.async (tile_ir/passes/pipelines.py). Programs whose schedule asks for a producer
    # (TileProgram.producer: large tiles, one block per SM) get it; for every kernel (this
    # option) it is off: with two blocks per SM every such kernel hung on the H200
    # (benchmarks/NOTES.md, session 4).
    tma_pipelines: bool = False
    # Blocks of a tensor-core kernel the compiler keeps registers for on one SM (TileLang's
    # default is 1): two let one block's epilogue overlap another's K loop (bert-base b32
    # 2.81 -> 2.70 ms)
    min_blocks_per_sm: int = 2
    # Blocks per SM of a producer-loaded kernel (TileProgram.producer). Above one, the warp
    # roles' register budgets (setmaxnreg) are set to fit that many blocks: TileLang's
    # defaults (consumers 240, producer 24) fit one, and an increase the SM cannot grant waits
    # forever. For measurement (variant "pbN"): on the H200 two blocks of 128x128 tiles still
    # hung with these budgets, and two of 64x128 ran but no faster than cp.async (NOTES.md)
    producer_blocks_per_sm: int = 1
    producer_registers: int = 24  # the producer warp's register budget then
    consumer_registers: int = 240  # the consumers' budget then, at most (TileLang's default)
    # Programmatic dependent launch (sm_90+), off by default. "release-first": every kernel
    # starts by releasing the next kernel in the stream (griddepcontrol.launch_dependents)
    # and then waits for the previous one to finish and its writes to be visible
    # (griddepcontrol.wait), before any memory access; "wait-first" waits, then releases (at
    # most one kernel ahead is resident). The runtime launches such kernels with programmatic
    # stream serialisation (launch metadata "programmatic"), so a kernel's launch and block
    # set-up overlap the previous kernel instead of following its completion. TileLang drops
    # __restrict__ from such kernels (no read-only load may move above the wait). Measured on
    # the H200 (NOTES.md, session 7): bert-base b1 0.430 -> 0.507 ms with "release-first"
    # (0.471 launched in plain stream order: the lost __restrict__ alone), b32 1.901 -> 1.891
    # (noise). Variants "pdl", "pdlwait".
    programmatic_launch: str | None = None
    # ``1 + erf(u)`` in float32 through a cheaper erfc (fast_math, tf_erf_plus_one): the
    # exact GELU's epilogue (NOTES.md, session 7)
    fast_erf_sum: bool = True
    # accumulators read element by element stay in registers; off, every accumulator an
    # epilogue reads is copied to a shared mirror first (tile_ir/passes/epilogues.py)
    epilogue_in_registers: bool = True
    staged_stores: bool = True  # epilogue results through a shared tile of the output type, copied out (epilogues.py)
    register_rows: bool = True  # a fragment A operand and row vectors beside register reductions stay in registers (placement.py)
    # an exact float32 product (an FMA loop, not tensor cores) accumulates in registers where
    # its tile splits evenly over the block, at most this many elements a thread
    # (placement.py), stepping over K outermost so one step's operand loads serve all of a
    # thread's elements; 0: in shared memory, a load and a store around every FMA (variant
    # "fmashared"). Measured on the H200 (NOTES.md, session 16)
    fma_registers: int = 128
    # bytes those tiles' rows are padded by against bank conflicts (a thread's accumulator
    # elements sit 8 rows apart; Nsight: 7-way conflicts on the QKV kernel's stores
    # unpadded), keeping each row 16-byte aligned for the vector copies out; 0 (or
    # False): no padding
    staging_pad: int = 16
    warp_rows: bool = True  # row programs one warp per row (warp_rows.py); off: the block-wide emission (variant "nowarp")
    cache_rows: bool = True  # global elements several steps read are loaded once into registers (warp_rows _Writer.cached)
    # each lane takes runs of this many bytes of the row's narrowest input type, read as one
    # vector load into registers (where the row width allows); 0: one element a lane ("wv0")
    vector_bytes: int = 16
    max_unroll: int = 32  # longer per-lane loops stay T.serial (nvcc unrolls them in part)
    # threads that share one reduction at most, where a block folds it through shared memory
    # (tile_ir/passes/lanes.py): one thread folds their partials, so more lanes would make
    # that fold the long pole
    reduction_lanes: int = 32
