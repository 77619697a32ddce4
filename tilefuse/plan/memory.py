"""Memory planning: one arena for every buffer the steps write, sized by liveness.

A buffer is live from the step that writes it to the last step that reads it (graph
outputs: to the end of the run, when they are copied out). Lifetimes are closed
intervals of step indices, so a step's inputs and outputs never share memory: kernels
are not required to be safe in place. Buffers whose lifetimes do not overlap may share
bytes. Placement is greedy best-fit, largest buffers first, every offset a multiple of
ALIGN.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from tilefuse.errors import PlanError, ShapeError
from tilefuse.plan.model import ALIGN, Buffer, BufferKind, Plan, Step

Lifetime = tuple[int, int]  # first and last step index, both inclusive


def align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def lifetimes(buffers: Sequence[Buffer], steps: Sequence[Step]) -> dict[int, Lifetime]:
    """Lifetime of each arena buffer; PlanError if one is read before it is written."""
    start: dict[int, int] = {}
    end: dict[int, int] = {}
    for i, step in enumerate(steps):
        for b in step.inputs:
            if buffers[b].kind.in_arena:
                if b not in start:
                    raise PlanError(f"{step.label} reads buffer {b} ({buffers[b].name}) before any step writes it")
                end[b] = i
        for b in step.outputs:
            if b in start:
                raise PlanError(f"{step.label} writes buffer {b} ({buffers[b].name}), written already by step {start[b]}")
            start[b] = end[b] = i
    out: dict[int, Lifetime] = {}
    for buf in buffers:
        if not buf.kind.in_arena:
            continue
        if buf.id not in start:
            raise PlanError(f"no step writes buffer {buf.id} ({buf.name})")
        last = len(steps) if buf.kind is BufferKind.OUTPUT else end[buf.id]
        out[buf.id] = (start[buf.id], last)
    return out


def assign_offsets(sizes: Mapping[int, int], lives: Mapping[int, Lifetime]) -> tuple[dict[int, int], int]:
    """Offsets for buffers of ``sizes`` bytes live over ``lives``; returns them and the arena size.

    Largest first so that big buffers claim space early and small ones fill the gaps;
    among the gaps left by buffers live at the same time, the tightest that fits wins.
    """
    placed: list[tuple[int, int, Lifetime]] = []  # offset, aligned size, lifetime
    offsets: dict[int, int] = {}
    for b in sorted(sizes, key=lambda b: (-sizes[b], lives[b][0], b)):
        size = align(sizes[b])
        first, last = lives[b]
        busy = sorted((o, o + s) for o, s, (f, l) in placed if s and f <= last and first <= l)
        best: tuple[int, int] | None = None  # (gap size, offset)
        cursor = 0
        for lo, hi in busy:
            gap = lo - cursor
            if gap >= size and (best is None or gap < best[0]):
                best = (gap, cursor)
            cursor = max(cursor, hi)
        offsets[b] = best[1] if best else cursor
        placed.append((offsets[b], size, (first, last)))
    arena = max((o + s for o, s, _ in placed), default=0)
    return offsets, arena


def plan_memory(buffers: Sequence[Buffer], steps: Sequence[Step]) -> tuple[list[Buffer], int]:
    """The buffers with arena offsets filled in, and the arena size in bytes."""
    lives = lifetimes(buffers, steps)
    offsets, arena = assign_offsets({b: buffers[b].nbytes for b in lives}, lives)
    placed = [
        Buffer(b.id, b.name, b.kind, b.type, offsets[b.id]) if b.id in offsets else b for b in buffers
    ]
    return placed, arena


def verify_memory(buffers: Sequence[Buffer], steps: Sequence[Step], arena_bytes: int) -> None:
    """PlanError unless every arena buffer is aligned, inside the arena, and shares no
    byte with a buffer live at the same time (a corrupt manifest must not give wrong
    answers silently)."""
    lives = lifetimes(buffers, steps)
    # Placement never needs more than every buffer side by side (assign_offsets puts each
    # at the end of those live with it at worst): a larger arena is a corrupt size.
    no_reuse = sum(align(buffers[b].nbytes) for b in lives)
    if not 0 <= arena_bytes <= no_reuse:
        raise PlanError(f"arena of {arena_bytes} bytes, but its buffers take {no_reuse} bytes without any reuse")
    spans = []
    for b in lives:
        buf = buffers[b]
        if buf.offset is None or buf.offset < 0 or buf.offset % ALIGN:
            raise PlanError(f"buffer {b} ({buf.name}): arena offset {buf.offset} is not a multiple of {ALIGN}")
        if buf.offset + buf.nbytes > arena_bytes:
            raise PlanError(f"buffer {b} ({buf.name}) ends past the arena ({arena_bytes} bytes)")
        if buf.nbytes:
            spans.append((buf.offset, buf.offset + buf.nbytes, lives[b], b))
    spans.sort()
    for i, (lo, hi, (f, l), b) in enumerate(spans):
        for lo2, _, (f2, l2), b2 in spans[i + 1 :]:
            if lo2 >= hi:
                break
            if f <= l2 and f2 <= l:
                raise PlanError(f"buffers {b} and {b2} overlap in the arena while both are live")


def check_fits(plan: Plan, limit: int, whose: str) -> None:
    """ShapeError unless the plan's weights, inputs and arena fit in ``limit`` bytes, the
    ``whose`` memory it runs in: caught when compiling, not as a MemoryError (or a failed
    device allocation) at the first run."""
    arena = plan.arena_bytes
    inputs = sum(b.nbytes for b in plan.buffers if b.kind is BufferKind.INPUT)
    weights = sum(b.nbytes for b in plan.buffers if b.kind is BufferKind.CONSTANT)
    total = arena + inputs + weights
    if total <= limit:
        return
    big = max(plan.buffers, key=lambda b: b.nbytes)
    raise ShapeError(
        f"the plan needs {_size(total)} (arena {_size(arena)}, inputs {_size(inputs)}, weights {_size(weights)}; "
        f"buffer {big.name!r} {big.type} alone takes {_size(big.nbytes)}), more than the {_size(limit)} of {whose}: "
        "bind smaller shapes"
    )


def _size(nbytes: int) -> str:
    n = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
