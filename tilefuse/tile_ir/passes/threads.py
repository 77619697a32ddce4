"""Thread fitting: a block's threads narrowed until they split every parallel nest evenly.

A lowering asks for the threads its pattern's policy gives (256 for a GEMM tile, 128 for a
row tile, 256 for a staged group, ...). On a device with blocks, TileLang lays a parallel
nest out over the block's threads evenly (tile_ir/nests.py: where it vectorises a nest or
holds it per thread it has no layout for an uneven split), so the pass halves the threads
until every nest at least as long as the block divides, writes the count the kernel will
have into the program and its schedule record, and keeps what was asked in
``TileProgram.fitted_from``: printers keep element loops for a narrowed block (its copies
and rows were sized for the asked threads). A device without blocks (the CPU) takes
programs as they are.
"""
from __future__ import annotations

from dataclasses import replace

from tilefuse.device import Device
from tilefuse.tile_ir.ir import TileProgram
from tilefuse.tile_ir.nests import uneven_nests


def fit_threads(program: TileProgram, device: Device) -> TileProgram:
    if not device.max_block_threads or program.fitted_from:
        return program
    threads = program.threads
    while threads > 1 and uneven_nests(program.body, threads):
        threads //= 2
    if threads == program.threads:
        return program
    schedule = program.schedule.with_threads(threads) if program.schedule is not None else None
    return replace(program, threads=threads, fitted_from=program.threads, schedule=schedule)
