"""Lowering a fusion group to one TileProgram, with a schedule chosen per target."""
from __future__ import annotations

from dataclasses import dataclass, replace

from tilefuse.ir.graph import Value
from tilefuse.partition.model import FusedGroup
from tilefuse.target import Target
from tilefuse.tile_ir.ir import TileProgram
from tilefuse.tile_ir.lower.attention import lower_attention
from tilefuse.tile_ir.lower.checks import IndexSite, IndexSites
from tilefuse.tile_ir.lower.gemm_epilogue import lower_gemm_epilogue
from tilefuse.tile_ir.lower.rows import lower_rows
from tilefuse.tile_ir.lower.staged import lower_staged
from tilefuse.tile_ir.lower.windows import lower_windows
from tilefuse.tile_ir.simplify import simplify_program
from tilefuse.tile_ir.verify import verify_program


@dataclass(frozen=True)
class Lowered:
    """A group's kernel and the values bound to its params, in order: the group's inputs
    (less scalar constants, folded into the code; a constant may be bound in a repacked
    copy, e.g. a conv weight as [K, M]), then the group's outputs. ``sites[k]`` says what
    the program's IndexCheck site k checks (the runtime's message when it fails)."""

    program: TileProgram
    bindings: tuple[Value, ...]
    sites: tuple[IndexSite, ...] = ()


def lower_group(group: FusedGroup, target: Target) -> Lowered:
    """The group as one kernel. Opaque groups are host steps, never lowered."""
    if str(group.kind) == "opaque":
        raise ValueError(f"group {group.id} is opaque: it runs as a host step")
    empty = any(v.type.size == 0 for n in group.nodes for v in (*n.inputs, *n.outputs))
    program, bindings = (
        # empty tensors (a dim of 0): nothing to tile; the staged schedule's loop nests of
        # zero trips still give reductions over nothing their identity
        lower_staged(group, group.name) if empty else None
        or lower_attention(group, group.name, target)
        or lower_gemm_epilogue(group, group.name, target)
        or lower_rows(group, group.name, target)
        or lower_windows(group, group.name, target)
        or lower_staged(group, group.name)
    )
    sites = IndexSites(group).sites
    program = simplify_program(replace(program, index_sites=len(sites)))
    verify_program(program, target)
    assert len(bindings) == len(program.params), "lowering binds every param to a value"
    return Lowered(program, bindings, tuple(sites))
