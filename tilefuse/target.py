"""Targets as data: a device, the schedule policies for it and the code-generation options.

``Target`` is what every stage is given: the cost model and the verifier read its device
(tilefuse/device.py, hardware facts only), the partitioner and the lowerings its per-pattern
policies (tilefuse/policies.py), the emitters its options (tilefuse/codegen/options.py). No
pass asks "is this CUDA?" or reads a module constant for a choice a target could make
differently: it reads a field of the Target it was given. ``fingerprint`` names everything
a plan was built with, so that plans record it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any

from tilefuse.codegen.options import CpuOptions, CudaOptions
from tilefuse.device import HOPPER, X86_SERVER, Device, native
from tilefuse.errors import TilefuseError
from tilefuse.policies import (AttentionPolicy, ConvPolicy, GemmPolicy, PartitionPolicy, RowsPolicy, ScatterPolicy,
                               StagedPolicy, WindowPolicy)


@dataclass(frozen=True, slots=True)
class Target:
    name: str  # "cpu", "cuda:sm_90a": the backend family, then the architecture
    device: Device
    gemm: GemmPolicy
    attention: AttentionPolicy
    rows: RowsPolicy = field(default_factory=RowsPolicy)
    conv: ConvPolicy = field(default_factory=ConvPolicy)
    window: WindowPolicy = field(default_factory=WindowPolicy)
    partition: PartitionPolicy = field(default_factory=PartitionPolicy)
    staged: StagedPolicy = field(default_factory=StagedPolicy)
    scatter: ScatterPolicy = field(default_factory=ScatterPolicy)
    codegen: CpuOptions | CudaOptions = field(default_factory=CpuOptions)
    # float32 products may round operands to TF32 on tensor cores (--precision tf32; GPU
    # only): the plan's precision, set by frontend.precision.precision_target
    tf32_products: bool = False

    @property
    def family(self) -> str:
        return self.device.family

    def spec(self) -> dict:
        """Every field, as JSON data."""
        return dataclasses.asdict(self)

    def fingerprint(self) -> str:
        """sha256 of ``spec()``: equal for targets that schedule and emit alike."""
        return hashlib.sha256(json.dumps(self.spec(), sort_keys=True).encode()).hexdigest()


def adjust(target: Target, **changes: object) -> Target:
    """A variant of ``target``: ``adjust(t, gemm__producer_steps=0, codegen__staging_pad=False,
    tf32_products=True)`` replaces one field of one part (``part__field``) or of the target."""
    # The values are the caller's, unchecked: replace() takes them as they come.
    parts: dict[str, dict[str, Any]] = {}
    top: dict[str, Any] = {}
    for key, value in changes.items():
        part, _, name = key.partition("__")
        if name:
            parts.setdefault(part, {})[name] = value
        else:
            top[key] = value
    for part, fields_ in parts.items():
        try:
            top[part] = dataclasses.replace(getattr(target, part), **fields_)
        except (AttributeError, TypeError) as e:
            raise TilefuseError(f"cannot adjust {part}: {e}") from None
    return dataclasses.replace(target, **top)


def for_this_machine(target: Target) -> Target:
    """``target`` as a plan built for this machine sees it: a CPU target whose kernels
    are built for this machine's instruction set (``isa`` native, the default) takes
    this machine's caches too (``device.native``: bert-base's MLP over 128 tokens and
    ViT's over 197 fit one row tile a core in a 2 MB L2, not in the 1 MB assumed of an
    unknown x86-64 server). A portable ISA level keeps the assumed device, and a target
    whose device the caller set keeps theirs."""
    if target.device != X86_SERVER or getattr(target.codegen, "isa", "") != "native":
        return target
    device = native(target.device)
    return target if device == target.device else dataclasses.replace(target, device=device)


CUDA_SM90A = Target(
    name="cuda:sm_90a",
    device=HOPPER,
    gemm=GemmPolicy(
        row_tile=16,  # the MMA's m; whole rows of 768 fp32 (48 KB) leave room for operand tiles
        half_operand_tiles=True,
        tile_k=64,  # operand tiles, accumulators and a chain's intermediate share 227 KB
        min_tile=32,  # 32x32 still splits into m16n8k16 pieces over 4 warps
        # 64x128x64 fp16 tiles, one warpgroup of wgmma, 3 stages of cp.async: bert-base b32's
        # four products ran 11-21% faster than on 128x128 tiles of two warpgroups (NOTES.md)
        tile=128,
        rows=64,
        max_threads=256,
        pack_siblings=True,
        accumulator_bytes=96 * 1024,  # 256 threads x 96 fp32 registers: siblings share it (QKV: 3 x 128x64, one 128x192 tile)
        inflight_bytes=80 * 1024,  # batch-1 tiles (32x32) are latency-bound: 3 stages of 128-deep K (NOTES.md)
        # 128x256 tiles, TMA, a producer warp and two consumer warpgroups, 3 stages: bert-base
        # b32's FFN products 54.2 -> 50.7 and 42.3 -> 40.1 us (35 K steps a core), 2048^3
        # 49.8 -> 27.6 us (31 steps); products with fewer K steps a core lost to the 64x128
        # cp.async tiles: the 768-wide projection (9 steps) 15.7 -> 17.2 us, the [768, 2304]
        # QKV product (26 steps) 33.8 -> 34.7 (NOTES.md)
        producer_steps=28,
    ),
    attention=AttentionPolicy(max_head_dim=256),
    conv=ConvPolicy(positions_inner=True),
    # a block's 256 threads, 16 terms each; rows from 256K terms (1 MB of fp32); reductions
    # over leading axes split to 32K outputs (132 SMs x 256 threads)
    rows=RowsPolicy(split_part=4096, split_window_outputs=1 << 15),
    window=WindowPolicy(tile=256, max_threads=256),
    codegen=CudaOptions(),
)

CPU = Target(
    name="cpu",
    device=X86_SERVER,
    # row_tile: a chain tile rereads both weight matrices: more rows, fewer rereads;
    # panel_width: two 16-float registers (or four 8-float ones) a K step; rows: a
    # product's row tile of 128 (128 tokens in one tile: each K block of a panel, in the
    # first-level cache, meets twice the rows): LLaMA 0.973, bert 0.981, GPT-2 0.987 at
    # 2 threads against 64 (NOTES.md, session 26); panel_grid_bytes: a 7 x 7 map's 49
    # rows by 320 columns (MobileNetV2's 960 -> 320 in 2 tiles of 160, not 5 of 64)
    gemm=GemmPolicy(row_tile=64, rows=128, panel_width=32, panel_grid_bytes=64 * 1024, staged_epilogue_flops=8,
                    staged_epilogue_selects=True, turned_epilogue=True, integer_products=True),
    # keys of a sequence up to 256 in one step (no rescaling pass), rows of whole 16-float vectors
    attention=AttentionPolicy(max_head_dim=512, key_tile=256, key_align=16),
    # depthwise_run: a 16-float vector (AVX-512; two 8-float ones elsewhere)
    conv=ConvPolicy(channel_rows=True, channel_tile=128, depthwise_channels=4, depthwise_positions=4096, depthwise_run=16,
                    depthwise_lanes=16, lanes_epilogue=True, depthwise_planes=1, depthwise_planes_width=16,
                    in_place_channels=12, direct=True, winograd=True, row_blocks=True),
    rows=RowsPolicy(split_part=1 << 18, split_row=1 << 20),  # parts worth a thread's share of a region (regions from 1M elements)
    # pooling tiles of whole output planes (56 x 56): few tiles, loops without division;
    # global pools folded in a 16-float vector's lanes
    window=WindowPolicy(tile=4096, lanes=16),
    codegen=CpuOptions(),
)

TARGETS = {t.name: t for t in (CPU, CUDA_SM90A)}
ALIASES = {"cuda": "cuda:sm_90a", "sm_90a": "cuda:sm_90a"}


def memory_limit(target: Target) -> tuple[int, str]:
    """The bytes a plan for ``target`` may take, and whose memory that is (for errors)."""
    if target.device.memory_bytes:
        return target.device.memory_bytes, f"memory of a {target.name} device"
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
