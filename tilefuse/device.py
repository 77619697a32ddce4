"""Devices as data: the facts of the hardware a plan runs on, each with its source.

A Device says what the machine is (cores, on-chip memory, registers, rates), never how to
use it: how big a tile is, how many threads a pattern takes or which code-generation
features are on are policies (tilefuse/policies.py) and options (tilefuse/codegen/options.py).
The cost model, the lowering, the verifier and the emitters read their hardware numbers
here, and nowhere else.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Device:
    name: str  # for people: "NVIDIA H100/H200", "x86-64 server"
    family: str  # the backend that runs it: "cpu" | "cuda"
    arch: str  # the instruction set the code is built for: "sm_90a"; "" for the CPU's default
    cores: int  # SMs on a GPU, cores on a CPU
    onchip_bytes: int  # shared memory one block may use (GPU) / L2 per core (CPU)
    registers_per_core: int  # 32-bit registers per SM (GPU); 0 where not modelled
    last_level_cache: int  # bytes
    dram_bandwidth: float  # bytes/s, measured
    matrix_flops: float  # FLOP/s of dense fp16/bf16 matrix products
    vector_flops: float  # FLOP/s of fp32 elementwise and fp32 matrix products
    launch_seconds: float  # cost of one kernel launch (CPU: a parallel region)
    # threads that run in lockstep and combine values by shuffles (GPU: a warp of 32); 0: none
    warp: int = 0
    mma_rows: int = 1  # rows the matrix unit takes at once (Hopper wgmma: 64); narrower tiles waste it
    max_block_threads: int = 0  # threads one block may have (GPU: 1024); 0: no blocks
    # fp32 lanes one core issues to per cycle (GPU: CUDA cores per SM); a block with fewer
    # threads leaves the rest of its core idle. 1 on a CPU (a core's SIMD is in its rates)
    lanes_per_core: int = 1
    # seconds one thread waits for a load from device memory when nothing else runs to hide
    # it (GPU: about half a microsecond); 0 where the schedules keep it hidden
    load_latency: float = 0.0
    # bytes a plan's weights, inputs and arena may take together (GPU: device memory);
    # 0: the physical memory of the host that compiles (a CPU plan runs in host memory)
    memory_bytes: int = 0
    # FLOP/s of integer products of uint8 by int8 values summed in int32 (a CPU's VNNI dot
    # products); 0: at ``vector_flops``
    int8_matrix_flops: float = 0.0


# NVIDIA H100/H200 (sm_90a). SMs, shared memory and registers: CUDA programming guide,
# compute capability 9.0 (228 KB per SM, 227 KB usable by one block, 64K registers, 1024
# threads a block, 128 FP32 cores per SM). L2 50 MB (H100 SXM whitepaper). Bandwidth and
# fp16 matrix rate were measured on the project's H200 (issue 3): ~4.3 TB/s, ~790 TFLOP/s
# dense; ~60 TFLOP/s plain fp32. A load that misses L2 takes on the order of 500 ns
# (published pointer-chasing measurements of H100: ~260 cycles to L2, several hundred ns
# to HBM). Memory: H200's 141 GB of HBM3e, the largest sm_90a part (H100: 80 GB), so a
# plan over it fits on no GPU of this target.
HOPPER = Device(
    name="NVIDIA H100/H200",
    family="cuda",
    arch="sm_90a",
    cores=132,
    onchip_bytes=227 * 1024,
    registers_per_core=65536,
    last_level_cache=50 * 1024 * 1024,
    dram_bandwidth=4.3e12,
    matrix_flops=790e12,
    vector_flops=60e12,
    launch_seconds=3e-6,
    warp=32,
    mma_rows=64,
    max_block_threads=1024,
    lanes_per_core=128,
    load_latency=5e-7,
    memory_bytes=141 * 10**9,
)

# A conservative x86-64 server core set (the 2-core development box and CI): AVX2 FMA at
# ~3 GHz gives ~100 GFLOP/s fp32 per core; ~10 GB/s of DRAM bandwidth per core; 1 MB of
# L2 per core; a "launch" is a parallel region of the thread pool (~5 us).
X86_SERVER = Device(
    name="x86-64 server",
    family="cpu",
    arch="",
    cores=2,
    onchip_bytes=1024 * 1024,
    registers_per_core=0,
    last_level_cache=32 * 1024 * 1024,
    dram_bandwidth=20e9,
    matrix_flops=200e9,
    vector_flops=200e9,
    launch_seconds=5e-6,
    # AVX-512 VNNI: one vpdpbusd does 64 u8 x s8 multiply-adds where an fp32 FMA does 16
    int8_matrix_flops=800e9,
)


def host_l2_per_core(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """This machine's second-level cache per core in bytes, as Linux describes cpu0's
    caches (a cache shared by several cores divided among them); 0 where it does not
    say (not Linux, a container without sysfs)."""
    base = Path(root)
    try:
        for index in sorted(base.glob("index[0-9]*")):
            if (index / "level").read_text().strip() != "2" or (index / "type").read_text().strip() == "Instruction":
                continue
            size = (index / "size").read_text().strip()
            scale = {"K": 1024, "M": 1024 * 1024}.get(size[-1:], 1)
            total = int(size.rstrip("KM")) * scale
            return total // max(1, _cpus((index / "shared_cpu_list").read_text().strip()))
    except (OSError, ValueError):
        return 0
    return 0


def _cpus(listing: str) -> int:
    """How many CPUs a Linux CPU list names ("0", "0-3", "0,4")."""
    count = 0
    for part in filter(None, listing.split(",")):
        first, _, last = part.partition("-")
        count += int(last or first) - int(first) + 1
    return count


def native(device: Device) -> Device:
    """``device`` as this machine is: a CPU's on-chip budget its second-level cache per
    core, where Linux says it (a plan built for this machine's instruction set is built
    for its caches too). Other devices, and hosts that do not say, as they are."""
    if device.family != "cpu":
        return device
    l2 = host_l2_per_core()
    return replace(device, onchip_bytes=l2) if l2 else device
