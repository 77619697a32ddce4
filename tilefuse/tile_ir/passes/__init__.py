"""Tile-IR passes that take the device: decisions the lowering leaves to the hardware.

    program = for_device(program, device)

Each pass returns a program the verifier accepts, with its schedule record updated to
what the kernel will do, so the code generators print what they are given. In order:

1. ``fit_threads`` (threads.py): a block's threads narrowed until they split every
   parallel nest evenly;
2. ``raise_copies`` (copies.py): plain tile loads from global memory become bulk
   ``Copy`` statements;
3. ``place_registers`` (placement.py): which fragment tiles the block holds in
   registers (the others in shared memory), in ``TileProgram.registers``.
"""
from __future__ import annotations

from tilefuse.device import Device
from tilefuse.tile_ir.ir import TileProgram
from tilefuse.tile_ir.passes.copies import raise_copies
from tilefuse.tile_ir.passes.placement import place_registers
from tilefuse.tile_ir.passes.threads import fit_threads

__all__ = ["fit_threads", "for_device", "place_registers", "raise_copies"]


def for_device(program: TileProgram, device: Device, register_rows: bool = True, t_copy: bool = True) -> TileProgram:
    """``program`` through every device pass, in order; ``register_rows`` and ``t_copy``:
    the CUDA code generator's options of those names (whether attention's P and row
    vectors stay in registers; whether plain tile loads are bulk copies)."""
    program = raise_copies(fit_threads(program, device), device, t_copy)
    return place_registers(program, device, register_rows)
