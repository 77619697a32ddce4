"""Targets as data: what a backend renders natively, its limits and its rates.

Every number the cost model and the lowering use lives here, with its source. No pass
asks "is this CUDA?"; it reads a field of the Target it was given.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from tilefuse.errors import TilefuseError


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    cores: int  # SMs on a GPU, cores on a CPU
    onchip_bytes: int  # shared memory one tile may use (GPU: per block) / L2 per core (CPU)
    registers_per_core: int  # 32-bit registers per SM (GPU); 0 where not modelled
    last_level_cache: int  # bytes
    dram_bandwidth: float  # bytes/s, measured
    matrix_flops: float  # FLOP/s of dense fp16/bf16 matrix products
    vector_flops: float  # FLOP/s of fp32 elementwise and fp32 matrix products
    launch_seconds: float  # cost of one kernel launch
    row_tile: int  # rows of a contraction tile when an epilogue needs whole rows
    max_attention_head_dim: int  # largest head dim a flash-style tile keeps on chip
    mma_rows: int = 1  # rows the matrix unit takes at once (Hopper wgmma: 64); narrower tiles waste it
    half_operand_tiles: bool = False  # half-float products keep operand tiles half (tensor cores)
    tile_k: int = 256  # K depth of a contraction tile (operand tiles are rows x tile_k, tile_k x cols)
    min_tile: int = 64  # smallest tile edge the lowering shrinks to where a grid would leave cores idle
    gemm_tile: int = 64  # edge of a plain contraction tile before shrinking for parallelism
    gemm_rows: int = 0  # its rows where they differ from gemm_tile (0: the same)
    max_threads: int = 128  # threads of a tile's block (GPU; a 128x128 product tile takes two warpgroups)
    accumulator_bytes: int = 1 << 30  # accumulators one plain product tile may hold (GPU: registers)
    inflight_bytes: int = 0  # operand bytes a small product tile keeps loading ahead (GPU); 0: 2 stages of tile_k
    # sibling products (Q, K, V) run as one product of their weights packed side by side,
    # each column tile running its own sibling's epilogue (GPU: one full-size accumulator
    # instead of one per sibling); else the siblings share the A tile, one accumulator each
    pack_siblings: bool = False
    max_group_nodes: int = 512  # cap that keeps pathological graphs tractable
    # longest path of primitives in one group: the lowering builds each element expression
    # recursively, and a few hundred levels overflow Python's stack (the zoo's deepest is 22)
    max_group_depth: int = 128
    window_tile: int = 256  # output elements of a pooling tile (GPU: one per thread of the block)
    # convolution tiles as [out channels x positions] (weights x im2col^T): NCHW outputs are
    # stored along positions, im2col rows are runs of input rows (CPU); else [positions x channels]
    conv_channel_rows: bool = False
    # float32 products may round operands to TF32 on tensor cores (--precision tf32; GPU only)
    tf32_products: bool = False
    # threads that run in lockstep and combine values by shuffles (GPU: a warp of 32); 0: none.
    # Row reductions then give each row whole warps
    warp: int = 0
    # large plain half-float products take ``producer_tile`` tiles (rows, columns) whose operand
    # loads a producer warp issues ahead of the matrix unit (sm_90a: TMA, warp-specialised,
    # one block a core), where each core then runs at least ``producer_steps`` K steps of
    # them (the pipeline's fill and drain amortised); 0: never
    producer_steps: int = 0
    producer_tile: tuple[int, int] = (128, 256)
    # bytes a plan's weights, inputs and arena may take together (GPU: device memory);
    # 0: the physical memory of the host that compiles (a CPU plan runs in host memory)
    memory_bytes: int = 0

    def row_epilogue_bytes(self, row_elems: int) -> int:
        """On-chip bytes for a tile of whole fp32 accumulator rows of ``row_elems``."""
        return self.row_tile * row_elems * 4


# NVIDIA H100/H200 (sm_90a). SMs, shared memory and registers: CUDA programming guide,
# compute capability 9.0 (228 KB per SM, 227 KB usable by one block, 64K registers).
# L2 50 MB (H100 SXM whitepaper). Bandwidth and fp16 matrix rate were measured on the
# project's H200 (issue 3): ~4.3 TB/s, ~790 TFLOP/s dense; ~60 TFLOP/s plain fp32.
CUDA_SM90A = Target(
    name="cuda:sm_90a",
    cores=132,
    onchip_bytes=227 * 1024,
    registers_per_core=65536,
    last_level_cache=50 * 1024 * 1024,
    dram_bandwidth=4.3e12,
    matrix_flops=790e12,
    vector_flops=60e12,
    launch_seconds=3e-6,
    row_tile=16,  # the MMA's m; whole rows of 768 fp32 (48 KB) leave room for operand tiles
    max_attention_head_dim=256,
    mma_rows=64,
    half_operand_tiles=True,
    tile_k=64,  # operand tiles, accumulators and a chain's intermediate share 227 KB
    min_tile=32,  # 32x32 still splits into m16n8k16 pieces over 4 warps
    # 64x128x64 fp16 tiles, one warpgroup of wgmma, 3 stages of cp.async: bert-base b32's four
    # products ran 11-21% faster than on 128x128 tiles of two warpgroups (benchmarks/NOTES.md)
    gemm_tile=128,
    gemm_rows=64,
    max_threads=256,
    pack_siblings=True,
    accumulator_bytes=96 * 1024,  # 256 threads x 96 fp32 registers: siblings share it (QKV: 3 x 128x64, one 128x192 tile)
    inflight_bytes=80 * 1024,  # batch-1 tiles (32x32) are latency-bound: 3 stages of 128-deep K (benchmarks/NOTES.md)
    warp=32,
    # 128x256 tiles, TMA, a producer warp and two consumer warpgroups, 3 stages: bert-base b32's
    # FFN products 54.2 -> 50.7 and 42.3 -> 40.1 us (35 K steps a core), 2048^3 49.8 -> 27.6 us
    # (31 steps); products with fewer K steps a core lost to the 64x128 cp.async tiles: the
    # 768-wide projection (9 steps) 15.7 -> 17.2 us, the [768, 2304] QKV product (26 steps)
    # 33.8 -> 34.7 (benchmarks/NOTES.md)
    producer_steps=28,
    # H200's 141 GB of HBM3e, the largest sm_90a part (H100: 80 GB): a plan over it fits on
    # no GPU of this target
    memory_bytes=141 * 10**9,
)

# A conservative x86-64 server core set (the 2-core development box and CI): AVX2 FMA at
# ~3 GHz gives ~100 GFLOP/s fp32 per core; ~10 GB/s of DRAM bandwidth per core; 1 MB of
# L2 per core; a "launch" is an OpenMP parallel region (~5 us).
CPU = Target(
    name="cpu",
    cores=2,
    onchip_bytes=1024 * 1024,
    registers_per_core=0,
    last_level_cache=32 * 1024 * 1024,
    dram_bandwidth=20e9,
    matrix_flops=200e9,
    vector_flops=200e9,
    launch_seconds=5e-6,
    row_tile=64,  # a chain tile rereads both weight matrices: more rows, fewer rereads
    window_tile=4096,  # pooling tiles of whole output planes (56 x 56): few tiles, loops without division
    conv_channel_rows=True,
    max_attention_head_dim=512,
)

TARGETS = {t.name: t for t in (CPU, CUDA_SM90A)}
ALIASES = {"cuda": "cuda:sm_90a", "sm_90a": "cuda:sm_90a"}


def memory_limit(target: Target) -> tuple[int, str]:
    """The bytes a plan for ``target`` may take, and whose memory that is (for errors)."""
    if target.memory_bytes:
        return target.memory_bytes, f"memory of a {target.name} device"
    try:
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):  # not a POSIX host: no bound to check
        return 1 << 62, "memory"
    return host, "memory this host has"


def get_target(name: str) -> Target:
    try:
        return TARGETS[ALIASES.get(name, name)]
    except KeyError:
        raise TilefuseError(f"unknown target {name!r}; known targets: {sorted(TARGETS)}") from None
