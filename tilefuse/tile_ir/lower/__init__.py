"""Lowering a fusion group to one TileProgram, with a schedule chosen per target."""
from __future__ import annotations

from tilefuse.partition.model import FusedGroup
from tilefuse.target import Target
from tilefuse.tile_ir.ir import TileProgram
from tilefuse.tile_ir.lower.staged import lower_staged


def lower_group(group: FusedGroup, target: Target) -> TileProgram:
    """The group as one kernel. Opaque groups are host steps, never lowered."""
    if str(group.kind) == "opaque":
        raise ValueError(f"group {group.id} is opaque: it runs as a host step")
    return lower_staged(group, group.name)
