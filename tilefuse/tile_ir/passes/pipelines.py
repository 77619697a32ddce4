"""Pipelines and residency: how a GPU kernel's pipelined loops load their tiles, and how
many of its blocks the compiler keeps registers for on one SM.

TMA or cp.async. A pipelined K loop whose body is only bulk tile copies from global
memory and products may load through TMA with a warp-specialised producer (TileLang's
default on sm_90a); any other keeps cp.async under TileLang's software pipeline. TMA is
taken where every such loop allows it and either the schedule asks for a producer
(``TileProgram.producer``: large tiles, one block per SM) or the code generator's
``tma_pipelines`` asks for it for every kernel (off: with two blocks per SM every such
kernel hung on the H200). The answer is ``TileProgram.tma``.

Residency (``TileProgram.residency``), in order of precedence:

- the schedule's own occupancy above 1 (every attention tile resident in one wave, a row
  program's tiles all at once): that many blocks;
- a producer-loaded kernel with ``producer_blocks`` above 1: that many blocks, and the warp
  roles' register budgets (setmaxnreg) that fit them beside each other: the producer's
  ``producer_registers``, the consumers' the most whole 8-register steps left, at most
  ``consumer_registers`` (TileLang's own default; an increase the SM cannot grant waits
  forever);
- a kernel with tensor-core products and no producer: ``min_blocks`` (two let one block's
  epilogue overlap another's K loop);
- else one, the compiler's default.

Devices without blocks take programs as they are; the verifier checks a kernel asks TMA
only of loops that allow it and register budgets the device has (``check_pipelines``).
"""
from __future__ import annotations

from dataclasses import replace

from tilefuse.device import Device
from tilefuse.errors import GraphError
from tilefuse.tile_ir.ir import Copy, Gemm, If, Loop, LoopKind, Residency, Scope, Stmt, TileProgram, statements
from tilefuse.tile_ir.nests import accumulation, parallel_nest

PRODUCER_THREADS = 128  # the producer warpgroup TileLang adds to a warp-specialised kernel


def plan_pipelines(program: TileProgram, device: Device, tma_pipelines: bool = False, min_blocks: int = 2,
                   producer_blocks: int = 1, producer_registers: int = 24, consumer_registers: int = 240) -> TileProgram:
    """``program`` with ``tma`` and ``residency`` set (see the module); the arguments are
    the code generator's ``tma_pipelines``, ``min_blocks_per_sm``, ``producer_blocks_per_sm``,
    ``producer_registers`` and ``consumer_registers``."""
    if not device.max_block_threads:
        return program
    p = program
    tma = (tma_pipelines or p.producer) and bulk_pipelines(p)
    if p.occupancy > 1:
        residency = Residency(p.occupancy)
    elif p.producer and producer_blocks > 1:
        consumers = (device.registers_per_core // producer_blocks - PRODUCER_THREADS * producer_registers) // p.threads
        residency = Residency(producer_blocks, producer_registers, min(consumers // 8 * 8, consumer_registers))
    elif min_blocks > 1 and not p.producer and any(isinstance(s, Gemm) and s.tensor_cores for s in statements(p.body)):
        residency = Residency(min_blocks)
    else:
        residency = Residency()
    return replace(program, tma=tma, residency=residency)


def bulk_pipelines(p: TileProgram) -> bool:
    """``p`` has pipelined loops (of more than one stage) and each holds only products and
    bulk copies from global memory. A row program of warps is printed without its loops."""
    loops = [] if p.row_lanes else _pipelined(p.body)
    return bool(loops) and all(all(isinstance(x, Gemm) or isinstance(x, Copy) and x.bulk
                                   and x.src.buffer.scope is Scope.GLOBAL for x in s.body) for s in loops)


def _pipelined(stmts: tuple[Stmt, ...]) -> list[Loop]:
    """The pipelined loops of more than one stage the CUDA printer prints as such (not those
    inside a staged nest or a running fold, whose loops it writes itself)."""
    out: list[Loop] = []
    for s in stmts:
        if isinstance(s, Loop) and s.kind is LoopKind.PARALLEL:
            nest = parallel_nest(s)
            if s.staging is None and accumulation(nest[-1].body) is None:
                out += _pipelined(nest[-1].body)
        elif isinstance(s, Loop):
            out += [s] if s.kind is LoopKind.PIPELINED and s.stages > 1 else []
            out += _pipelined(s.body)
        elif isinstance(s, If):
            out += _pipelined(s.body)
    return out


def check_pipelines(p: TileProgram, device: Device | None) -> None:
    """Raise GraphError where a kernel asks for TMA of loops that do not allow it, or
    register budgets without a producer, for no blocks, or beyond the device's registers
    (``device``: None, not checked)."""
    r = p.residency
    if p.tma and not bulk_pipelines(p):
        raise GraphError(f"kernel {p.name}: TMA pipelines, but a pipelined loop holds more than products and bulk copies")
    if r.blocks < 1 or (r.producer_registers or r.consumer_registers) and not (
            p.producer and r.producer_registers > 0 and r.consumer_registers > 0):
        raise GraphError(f"kernel {p.name}: residency {r} is not blocks and, for a producer-loaded kernel, both budgets")
    if device is not None and r.consumer_registers:
        need = r.blocks * (PRODUCER_THREADS * r.producer_registers + p.threads * r.consumer_registers)
        if need > device.registers_per_core:
            raise GraphError(f"kernel {p.name}: {r.blocks} blocks of these register budgets take {need} registers, "
                             f"the device has {device.registers_per_core}")
