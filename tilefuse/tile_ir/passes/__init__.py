"""Tile-IR passes that take the device: decisions the lowering leaves to the hardware.

    program = for_device(program, device)

Each pass returns a program the verifier accepts, with its schedule record updated to
what the kernel will do, so the code generators print what they are given. In order:

1. ``fit_threads`` (threads.py): a block's threads narrowed until they split every
   parallel nest evenly;
2. ``raise_copies`` (copies.py): plain tile loads from global memory become bulk
   ``Copy`` statements;
3. ``place_registers`` (placement.py): which fragment tiles the block holds in
   registers (the others in shared memory), in ``TileProgram.registers``;
4. ``warp_rows`` (rows.py): whether a row program takes whole warps per row, and how many
   lanes, in ``TileProgram.row_lanes``;
5. ``assign_lanes`` (lanes.py): how many threads share each other reduction the block does
   not fold in registers, on the statement (``ReduceTile.lanes``, ``Loop.lanes``);
6. ``stage_epilogues`` (epilogues.py): which register accumulators the epilogue reads
   through a shared mirror (allocs and copies of the program), and which epilogue nests
   store through a shared tile (``Loop.staging``);
7. ``plan_pipelines`` (pipelines.py): TMA or cp.async for the pipelined loops
   (``TileProgram.tma``), and the blocks a core keeps resident (``TileProgram.residency``).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from tilefuse.device import Device
from tilefuse.tile_ir.ir import TileProgram
from tilefuse.tile_ir.passes.copies import raise_copies
from tilefuse.tile_ir.passes.epilogues import stage_epilogues
from tilefuse.tile_ir.passes.lanes import assign_lanes
from tilefuse.tile_ir.passes.pipelines import plan_pipelines
from tilefuse.tile_ir.passes.placement import place_registers
from tilefuse.tile_ir.passes.rows import warp_rows
from tilefuse.tile_ir.passes.threads import fit_threads

__all__ = ["DeviceOptions", "assign_lanes", "fit_threads", "for_device", "place_registers", "plan_pipelines",
           "raise_copies", "stage_epilogues", "warp_rows"]


@dataclass(frozen=True, slots=True)
class DeviceOptions:
    """The code generator's options these passes read: the fields of the same names of
    ``CudaOptions`` (tilefuse/codegen/options.py, where each is explained; tile_ir does not
    import codegen), with its defaults."""

    t_copy: bool = True  # plain tile loads are bulk copies
    register_rows: bool = True  # attention's P and row vectors beside register reductions in registers
    fma_registers: int = 128  # exact (FMA-loop) products accumulate in registers, up to this many elements a thread; 0: never
    reduction_lanes: int = 32  # threads that share one reduction at most
    warp_rows: bool = True  # row programs one warp per row
    epilogue_in_registers: bool = True  # accumulators read element by element stay in registers
    staged_stores: bool = True  # epilogue results through a shared tile of the output type
    staging_pad: int = 16  # bytes those tiles' rows are padded by
    tma_pipelines: bool = False  # TMA for every kernel whose pipelined loops allow it (not only producer-loaded ones)
    min_blocks_per_sm: int = 2  # blocks of a tensor-core kernel a core keeps resident
    producer_blocks_per_sm: int = 1  # blocks of a producer-loaded kernel a core keeps resident
    producer_registers: int = 24  # the producer warp's register budget then
    consumer_registers: int = 240  # the consumers' budget then, at most

    @classmethod
    def of(cls, options: object) -> DeviceOptions:
        """The fields of a target's code-generation options these name; options without
        them (the CPU's) leave the defaults, which devices without blocks never read."""
        defaults = cls()
        return cls(**{f.name: getattr(options, f.name, getattr(defaults, f.name)) for f in fields(cls)})


def for_device(program: TileProgram, device: Device, options: DeviceOptions = DeviceOptions()) -> TileProgram:
    """``program`` through every device pass, in order."""
    program = raise_copies(fit_threads(program, device), device, options.t_copy)
    program = place_registers(program, device, options.register_rows, options.fma_registers)
    program = warp_rows(program, device, options.warp_rows)
    program = assign_lanes(program, device, options.reduction_lanes)
    program = stage_epilogues(program, device, options.epilogue_in_registers, options.staged_stores, options.staging_pad)
    return plan_pipelines(program, device, options.tma_pipelines, options.min_blocks_per_sm,
                          options.producer_blocks_per_sm, options.producer_registers, options.consumer_registers)
