"""Long reductions to a few outputs are split in two, so that every core takes part.

A reduction whose outputs are fewer than the target's cores leaves most of them idle,
however it is tiled: a row is one tile (one block on the GPU, one thread's share on the
host), and a whole-tensor sum is one output. ``sum(x)`` over ``L`` terms for each of ``O``
outputs becomes

    partial = reduce(reshape(x, [O, P, L / P]), last axis)   # O x P rows: parallel
    result  = reduce(partial, the parts' axis)               # O outputs of P terms: small

The moves fuse into the partial kernel as index arithmetic. Where some reduced axes are
the trailing ones and others are not (a per-channel sum over N, H, W), the trailing run is
reduced first, dims kept, and the rest after; that first reduction is split again if its
outputs are still too few. Where no reduced axis is last, they are transposed there. Sums, products, maxima and minima are
associative, so the result is the same up to rounding order; partial sums and products of
half floats are kept in float32, as one reduction accumulates them. ``P`` divides ``L``
and leaves each part at least ``RowsPolicy.split_part`` terms; a length with no such
divisor is left whole (its rows are walked in chunks, one tile each). On a device with blocks
a reduction over leading axes (its last axis kept: one thread an output) to fewer outputs
than ``RowsPolicy.split_window_outputs`` is split in place along its first reduced axis, so
both kernels still read along the last axis (512 column sums of 4,096 rows: 32,768 partial
sums of 64 terms, then 512 of 64). A reduction that
keeps a row axis is split only from ``RowsPolicy.split_row`` terms: below that one block
reads its row faster than two more kernels launch, and the rows kernel fuses a norm's
reductions and its normalisation, which the split would part.

The rewrite runs on the primitive graph before grouping, in place: the final node writes
the original output value, so its readers and the graph's outputs are unchanged; the new
nodes keep the original node's ``origin`` (the report and ``--explain`` name the ONNX node).
"""
from __future__ import annotations

import math

from tilefuse.ir.dtypes import HALF_FLOATS, DType
from tilefuse.ir.graph import Graph, Node, Value
from tilefuse.ir.prims import Map, Reduce, ReduceFn, Reshape, ScalarFn, Transpose
from tilefuse.partition.rewrite import Emitter, FreshNames
from tilefuse.target import Target

WIDENED = (ReduceFn.SUM, ReduceFn.PROD)  # half-float partials of these kept in float32


def split_long_reductions(graph: Graph, target: Target) -> list[Node]:
    """Split each reduction of ``graph`` whose outputs are fewer than ``target``'s cores and
    whose length has a divisor into parts of at least the policy's ``split_part`` terms;
    returns the reductions split (the nodes removed)."""
    policy, cores = target.rows, target.device.cores
    if not policy.split_part:
        return []
    split = []
    names = FreshNames(graph)
    work = [n for n in graph.nodes if isinstance(n.op, Reduce)]
    while work:
        node = work.pop(0)
        if _worth_splitting(node, cores, policy.split_part, policy.split_row):
            made = _split(graph, node, cores, policy.split_part, policy.split_parts, names)
            work += [n for n in made if isinstance(n.op, Reduce) and n is not made[-1]]
        elif policy.split_window_outputs:  # (its two stages are final)
            made = _split_window(graph, node, policy.split_window_outputs, policy.split_window_terms,
                                 policy.split_window_length, names)
        else:
            continue
        if made:
            split.append(node)
    return split


def _worth_splitting(node: Node, cores: int, part: int, row: int) -> bool:
    """Fewer outputs than cores, and long enough that the cores' share beats the extra
    kernels: ``row`` terms where the reduction keeps a row axis (the rows pattern, a block
    or a thread's share a row, and the other row reductions and the normalisation fused
    with it), two parts where it has none or keeps its last axis (a window: one thread an
    output)."""
    op = node.op
    assert isinstance(op, Reduce)
    shape = node.inputs[0].type.shape
    outputs = math.prod(d for i, d in enumerate(shape) if i not in op.axes)
    length = math.prod(shape[i] for i in op.axes)
    rows = op.axes == (len(shape) - 1,) and len(shape) > 1
    return 0 < outputs < cores and length >= (row if rows else 2 * part)


def _parts(outputs: int, length: int, cores: int, part: int, most: int) -> int:
    """How many parts to split ``outputs`` reductions of ``length`` terms into (a few a
    core, each at least ``part`` terms, dividing the length); 0: none."""
    want = min(most, -(-cores // outputs) * 4, length // part)
    return max((p for p in range(2, want + 1) if length % p == 0), default=0)


def _stages(emit: Emitter, v: Value, shape: tuple[int, ...], first: tuple[int, ...], second: tuple[int, ...],
            hints: tuple[str, str, str]) -> None:
    """In place of ``emit``'s reduction: ``v`` reshaped to ``shape`` and reduced over
    ``first``, then over ``second`` (dims kept, the node's own function; half-float sums
    and products in float32 between), shaped into the node's own output."""
    op, out = emit.node.op, emit.node.outputs[0]
    assert isinstance(op, Reduce)
    half = v.type.dtype in HALF_FLOATS and op.fn in WIDENED
    dtype = v.type.dtype
    v = emit(Reshape(shape), v, hints[0])
    if half:
        v = emit(Map(ScalarFn.CAST, DType.FLOAT32), v, "widened")
    v = emit(Reduce(op.fn, first, True), v, hints[1])
    v = emit(Reduce(op.fn, second, True), v, hints[2])
    if half:
        v = emit(Map(ScalarFn.CAST, dtype), v, "narrowed")
    emit(Reshape(out.type.shape), v, "shaped", result=out)


def _replace(graph: Graph, node: Node, made: list[Node]) -> list[Node]:
    """``made`` in ``node``'s place in ``graph`` (its input no longer read by it)."""
    x = node.inputs[0]
    x.users[:] = [u for u in x.users if u is not node]
    at = graph.nodes.index(node)
    graph.nodes[at:at + 1] = made
    return made


def _split_window(graph: Graph, node: Node, want: int, terms: int, least: int, names: FreshNames) -> list[Node]:
    """A reduction over leading axes (its last axis kept) to fewer than ``want`` outputs,
    split in place along the first reduced axis that divides into parts of at least
    ``terms`` terms: ``x[..., L, ...]`` as ``[..., P, L / P, ...]``, reduced over the same
    axes (the partial: P times the outputs, each still a window), then over the parts.
    Rows stay where they are in memory, so both kernels read along the kept last axis.
    Only from ``least`` terms an output. The nodes made (none: left whole)."""
    op = node.op
    assert isinstance(op, Reduce)
    x = node.inputs[0]
    shape, axes, rank = x.type.shape, op.axes, x.type.rank
    outputs = math.prod(d for i, d in enumerate(shape) if i not in axes)
    if rank - 1 in axes or not 0 < outputs < want or math.prod(shape[b] for b in axes) < least:
        return []
    for a in axes:
        length = shape[a]
        divisors = [p for p in range(2, length // terms + 1) if length % p == 0]
        if divisors:
            break
    else:
        return []
    enough = [p for p in divisors if p * outputs >= want]
    parts = min(enough) if enough else max(divisors)
    emit = Emitter(node, names)
    _stages(emit, x, shape[:a] + (parts, length // parts) + shape[a + 1:], tuple(b + 1 if b >= a else b for b in axes), (a,),
                ("parts", "partial", "total"))
    return _replace(graph, node, emit.made)


def _split(graph: Graph, node: Node, cores: int, part: int, most: int, names: FreshNames) -> list[Node]:
    """Replace ``node`` by its two-stage form; the nodes made (none: left whole)."""
    op = node.op
    assert isinstance(op, Reduce)
    x = node.inputs[0]
    shape, axes, rank = x.type.shape, op.axes, x.type.rank
    emit = Emitter(node, names)
    trailing = [a for a in range(rank - 1, -1, -1) if a in axes]
    run = tuple(sorted(a for k, a in enumerate(trailing) if a == rank - 1 - k))  # the reduced axes at the end
    v = x
    if run and len(run) < len(axes):
        # reduce the trailing run first (rows, whole blocks), then the rest of the axes:
        # the first stage is a reduction of its own, split again if still too few outputs
        # the run merged into one last axis first: a row reduction (the rows pattern)
        head = shape[:run[0]]
        _stages(emit, v, head + (math.prod(shape[a] for a in run),), (len(head),), tuple(a for a in axes if a not in run),
                    ("run", "inner", "outer"))
    else:
        kept = [i for i in range(rank) if i not in axes]
        lead = tuple(shape[i] for i in kept)
        length = math.prod(shape[i] for i in axes)
        parts = _parts(math.prod(lead), length, cores, part, most)
        if not parts:
            return []
        if kept + list(axes) != list(range(rank)):  # no reduced axis last: move them there
            v = emit(Transpose(tuple(kept + list(axes))), v, "reduced-last")
        # over the last axis, dims kept: the rows pattern's reductions (a block a row); the
        # total over the parts' axis of [.., P, 1] (a reshape between them would join the
        # partial group, where no element may leave its row)
        _stages(emit, v, lead + (parts, length // parts), (len(lead) + 1,), (len(lead),), ("parts", "partial", "total"))
    return _replace(graph, node, emit.made)
