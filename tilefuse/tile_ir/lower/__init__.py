"""Lowering a fusion group to one TileProgram, with a schedule chosen per target.

Which kernel a group becomes was decided once, by its pattern (``group.match``, made by
``tilefuse/patterns/`` when the partition was final); here each match type has its
lowering, which builds the tiles around the match's nodes and never matches again, and
records what it chose in the program's schedule (``tile_ir/schedule.py``). A
lowering may still find no tiles that fit its match (awkward sizes): then the patterns
after it, in their order, are tried, and the program's notes say so — over the zoo this
never happens (tests/tile_ir/test_patterns_zoo.py).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from tilefuse import patterns
from tilefuse.errors import GraphError
from tilefuse.ir.graph import Value
from tilefuse.partition.model import FusedGroup
from tilefuse.target import Target
from tilefuse.tile_ir.ir import TileProgram
from tilefuse.tile_ir.lower.attention import lower_attention
from tilefuse.tile_ir.lower.checks import IndexSite, IndexSites
from tilefuse.tile_ir.lower.gemm_epilogue import lower_gemm_epilogue
from tilefuse.tile_ir.lower.rows import lower_rows
from tilefuse.tile_ir.lower.scatter import lower_scatter
from tilefuse.tile_ir.lower.staged import lower_staged
from tilefuse.tile_ir.lower.windows import lower_windows
from tilefuse.tile_ir.passes import DeviceOptions, for_device
from tilefuse.tile_ir.simplify import simplify_program
from tilefuse.tile_ir.verify import verify_program

Lowering = Callable[..., "tuple[TileProgram, tuple[Value, ...]] | None"]

# one lowering per match type: what it returns for that match, or None where no tiles fit
LOWERINGS: dict[type, Lowering] = {
    patterns.AttentionMatch: lower_attention,
    patterns.GemmMatch: lower_gemm_epilogue,
    patterns.RowsMatch: lower_rows,
    patterns.WindowsMatch: lower_windows,
    patterns.ScatterMatch: lower_scatter,
    patterns.StagedMatch: lower_staged,
}


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
    """The group as one kernel, by the lowering of its match. Opaque groups are host
    steps, never lowered. The match was made for the partition's target (a few of its
    answers depend on it: the longest row, whether tiles must divide the rows): lower
    for that target."""
    if str(group.kind) == "opaque":
        raise ValueError(f"group {group.id} is opaque: it runs as a host step")
    match = group.match
    if match is None or isinstance(match, patterns.Refusal) or type(match) not in LOWERINGS:
        raise GraphError(f"group {group.id} carries no kernel pattern ({match}): partition_graph sets it")
    program, bindings = _lower(group, match, target)
    if program.schedule is None:  # every lowering records what it chose (tile_ir/schedule.py)
        raise GraphError(f"group {group.id}: the {patterns.pattern_name(match)} lowering gave no schedule record")
    sites = IndexSites(group).sites
    program = simplify_program(replace(program, index_sites=len(sites)))
    program = for_device(program, target.device, DeviceOptions.of(target.codegen))
    verify_program(program, target)
    assert len(bindings) == len(program.params), "lowering binds every param to a value"
    return Lowered(program, bindings, tuple(sites))


def _lower(group: FusedGroup, match: patterns.Match, target: Target) -> tuple[TileProgram, tuple[Value, ...]]:
    """The lowering of ``match``; where it finds no tiles, the next pattern's (staged, the
    last, always lowers), the declined ones named in the program's notes."""
    declined: list[str] = []
    while True:
        lowered = LOWERINGS[type(match)](group, match, group.name, target)
        if lowered is not None:
            break
        declined.append(patterns.pattern_name(match))
        following = patterns.match_group(group.nodes, group.outputs, target, after=type(match))
        if isinstance(following, patterns.Refusal):  # staged, the last, always lowers: never reached
            raise GraphError(f"group {group.id}: no lowering after {declined[-1]}: {following.reason}")
        match = following
    program, bindings = lowered
    if declined:
        note = f"fell through: the {', '.join(declined)} lowering found no tiles for its match"
        program = replace(program, notes=(*program.notes, note))
    return program, bindings
