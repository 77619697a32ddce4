"""Copy raising: parallel nests that fill a whole tile from a rectangle of a global tensor
become bulk ``Copy`` statements.

A lowering writes an operand tile as a nest ``tile[i, j] = src[c, o0 + i, o1 + j]``
(leading fixed indices, then each loop variable once, in order, plus an offset free of
them). On a GPU such a tile is loaded in bulk — vectorised, asynchronous, and overlapped
with the products by a pipelined K loop — so the pass turns the nest into ``Copy(src
region, tile, bulk=True)``, which the CUDA printer emits as ``T.copy``. Any other fill
(guarded tails, casts, transposes, reshapes) stays an element nest. Programs whose block
was narrowed (``fitted_from``: their copies were sized for the threads asked) and row
programs (the CUDA printer may lay their tiles out one warp per row, element nests
expected) are left as they are, as are devices without blocks.
"""
from __future__ import annotations

from dataclasses import replace

from tilefuse.device import Device
from tilefuse.tile_ir.ir import Copy, If, Load, Loop, LoopKind, Region, Scope, Stmt, Store, TileProgram, const_index
from tilefuse.tile_ir.nests import parallel_nest, rectangle


def raise_copies(program: TileProgram, device: Device, enabled: bool = True) -> TileProgram:
    """``program`` with its plain tile loads as bulk copies; ``enabled``: the CUDA code
    generator's ``t_copy`` option."""
    family = program.schedule.family if program.schedule is not None else ""
    if not device.max_block_threads or not enabled or program.fitted_from or family == "rows":
        return program
    body = _raise(program.body)
    return program if body == program.body else replace(program, body=body)


def _raise(stmts: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
    """Statements with each raisable parallel nest a Copy, looking inside serial and
    pipelined loops and branches (not inside parallel nests: a nest is one unit)."""
    out: list[Stmt] = []
    for s in stmts:
        if isinstance(s, Loop) and s.kind is LoopKind.PARALLEL:
            out.append(tile_load(parallel_nest(s)) or s)
        elif isinstance(s, Loop):
            out.append(replace(s, body=_raise(s.body)))
        elif isinstance(s, If):
            out.append(replace(s, body=_raise(s.body)))
        else:
            out.append(s)
    return tuple(out)


def tile_load(loops: list[Loop]) -> Copy | None:
    """The nest ``loops`` as a bulk Copy, or None where it is not a plain tile load."""
    body = loops[-1].body
    if len(body) != 1 or not isinstance(body[0], Store):
        return None
    st, names = body[0], [l.var for l in loops]
    dst, value = st.buffer, st.value
    if dst.scope is Scope.GLOBAL or st.indices != tuple(names) or dst.shape != tuple(l.extent for l in loops):
        return None
    if not isinstance(value, Load) or value.buffer.scope is not Scope.GLOBAL or value.buffer.dtype is not dst.dtype:
        return None
    rect = rectangle(value.indices, loops)
    if rect is None:
        return None
    src = Region(value.buffer, tuple(o for o, _ in rect), tuple(1 if e is None else e for _, e in rect))
    return Copy(src, Region(dst, tuple(const_index(0) for _ in dst.shape), dst.shape), bulk=True)
