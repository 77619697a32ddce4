"""Tile-IR passes that take the device: decisions the lowering leaves to the hardware.

    program = for_device(program, device)

Each pass returns a program the verifier accepts, with its schedule record updated to
what the kernel will do, so the code generators print what they are given. In order:

1. ``fit_threads`` (threads.py): a block's threads narrowed until they split every
   parallel nest over fragment tiles evenly.
"""
from __future__ import annotations

from tilefuse.device import Device
from tilefuse.tile_ir.ir import TileProgram
from tilefuse.tile_ir.passes.threads import fit_threads

__all__ = ["fit_threads", "for_device"]


def for_device(program: TileProgram, device: Device) -> TileProgram:
    """``program`` through every device pass, in order."""
    return fit_threads(program, device)
