"""Accumulator epilogues: where a product's results are read, and how they are stored.

After its last product, a block's register accumulator (placement: a tensor-core tile) is
read by the epilogue. A thread holds only its own elements (TileLang lays a parallel nest
over exactly the accumulator's shape out as the accumulator's fragment), so:

- an epilogue that reads each element ``acc[i, j]`` in a nest over the accumulator's
  shape (i, j its loop variables, in order) reads registers as they are;
- one that reads other threads' elements (whole-row norms, products of the tile, a
  transposed store that could not be staged) needs the accumulator in shared memory: the
  pass adds a shared *mirror* tile, a bulk ``Copy`` of the accumulator into it after the
  statement holding the last product, and points the loads after it at the mirror;
- where only some tile-uniform branches need that (packed siblings: one of them written
  transposed), the copy is made at the start of those branches, whose loads read the
  mirror, and the others keep reading registers.

Then each epilogue nest of two loops that stores a register accumulator's results to a
global output gets a ``Staging`` (``Loop.staging``): each thread computes its own elements
into a shared tile of the output's type, and whole-line copies write the tile out, in one
piece where the store's indices are a rectangle of the output, else in per-head pieces
(a tile of two 64-wide heads written [batch, head, seq, d]). A nest over (columns, rows)
of an accumulator whose output runs along the rows (attention's K written [d, seq]) is
*transposed*: it reads registers in the accumulator's order into a [column, row] tile.
Tile rows are padded by ``pad_bytes`` (a thread's accumulator elements sit 8 rows apart;
unpadded power-of-two rows put them in one bank), except under a producer (TMA stores the
tile as one contiguous box).

``in_registers`` and ``staged`` are the code generator's ``epilogue_in_registers`` and
``staged_stores``; off, every such accumulator is mirrored, or nothing is staged. The CUDA
printer allocates, copies and stores what the program says; the verifier checks each
staging's pieces against its store (``check_staging``). Devices without blocks, and row
programs laid out as warps, take programs as they are.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from tilefuse.device import Device
from tilefuse.errors import GraphError
from tilefuse.tile_ir.ir import (
    Buffer,
    Call,
    Const,
    Copy,
    Expr,
    Gemm,
    If,
    IndexCheck,
    IndexOp,
    IOp,
    Load,
    Loop,
    LoopKind,
    Piece,
    ReduceTile,
    Region,
    Scope,
    Staging,
    Stmt,
    Store,
    TileProgram,
    Var,
    const_index,
    iop,
    statements,
    subexpressions,
    substitute,
)
from tilefuse.tile_ir.nests import accumulation, mentions, parallel_nest, reads, rectangle, stmt_reads
from tilefuse.tile_ir.simplify import simplify_expr


@dataclass(frozen=True)
class _Mirror:
    """An accumulator's shared copy, made after top-level statement ``after`` or, where
    ``branches`` (top-level Ifs, by id) are given, at the start of each of them."""

    acc: Buffer
    tile: Buffer
    after: int
    branches: frozenset[int]


def stage_epilogues(program: TileProgram, device: Device, in_registers: bool = True, staged: bool = True,
                    pad_bytes: int = 16) -> TileProgram:
    """``program`` with its accumulators' mirrors and its staged stores (see the module)."""
    if not device.max_block_threads or program.row_lanes or _mirrored(program):
        return program
    p = program
    products, reduced = _gemm_targets(p.body), _reduce_buffers(p.body)
    accs = [b for b in p.allocs if b.name in p.registers and b.name in products and b.name not in reduced]
    transposed: dict[int, tuple[Buffer, tuple[Piece, ...]]] = {}  # id(nest head) -> (accumulator, pieces)
    kept: list[Buffer] = []  # accumulators the epilogue reads in registers (outside mirrored branches)
    mirrors: list[_Mirror] = []
    taken = {b.name for b in (*p.params, *p.allocs)}
    for acc in accs:
        if staged and in_registers:
            transposed |= _transposed_stores(p, acc)
        if in_registers and own_element_epilogue(p.body, acc, transposed):
            kept.append(acc)
            continue
        name = f"{acc.name}_s"
        while name in taken:
            name += "_"
        taken.add(name)
        tile = Buffer(name, acc.dtype, acc.shape, Scope.SHARED)
        branches = _mirrored_branches(p.body, acc, transposed) if in_registers else None
        if branches:
            kept.append(acc)
        mirrors.append(_Mirror(acc, tile, _last_gemm(p.body, acc.name), frozenset(map(id, branches or ()))))
    if not kept and not mirrors:
        return program
    writer = _Writer(p, set(kept), transposed, 0 if p.producer else pad_bytes, staged)
    body = writer.top(mirrors)
    allocs: list[Buffer] = []
    for b in p.allocs:
        allocs += [b] + [m.tile for m in mirrors if m.acc == b]
    return replace(program, body=body, allocs=tuple(allocs))


class _Writer:
    """The rebuilt body: mirrors copied and read, staged nests marked, in one walk that
    follows the CUDA printer's (a nest that folds a running value holds no nests it prints
    as nests)."""

    def __init__(self, p: TileProgram, kept: set[Buffer], transposed: dict[int, tuple[Buffer, tuple[Piece, ...]]],
                 pad_bytes: int, staged: bool) -> None:
        self.p, self.kept, self.transposed, self.pad_bytes, self.staged = p, kept, transposed, pad_bytes, staged
        # per set of retargeted accumulators: id(expression) -> the expression retargeted
        self.memo: dict[frozenset[tuple[Buffer, Buffer]], dict[int, Expr]] = {}

    def top(self, mirrors: list[_Mirror]) -> tuple[Stmt, ...]:
        out: list[Stmt] = []
        aliased: dict[Buffer, Buffer] = {}  # accumulator -> the mirror its loads read from here on
        for i, s in enumerate(self.p.body):
            inside = [m for m in mirrors if id(s) in m.branches]
            if inside and isinstance(s, If):  # the branch copies and reads its own mirrors
                alias = aliased | {m.acc: m.tile for m in inside}
                live = self.kept - {m.acc for m in inside}
                body = tuple(_whole_copy(m.acc, m.tile) for m in inside) + self.stmts(s.body, live, alias)
                out.append(replace(s, cond=self.expr(s.cond, aliased), body=body))
            else:
                out += self.stmts((s,), self.kept, aliased)
            for m in mirrors:
                if m.after == i and not m.branches:
                    out.append(_whole_copy(m.acc, m.tile))
                    aliased = aliased | {m.acc: m.tile}
        return tuple(out)

    def stmts(self, stmts: tuple[Stmt, ...], live: set[Buffer], alias: dict[Buffer, Buffer]) -> tuple[Stmt, ...]:
        return tuple(self.stmt(s, live, alias) for s in stmts)

    def stmt(self, s: Stmt, live: set[Buffer], alias: dict[Buffer, Buffer]) -> Stmt:
        if isinstance(s, Loop) and s.kind is LoopKind.PARALLEL:
            how = self.staged_how(s, live)  # decided on the nest as lowered, its pieces on the nest as rebuilt
            nest = parallel_nest(s)
            if how is not None or accumulation(nest[-1].body) is not None:
                body = tuple(self.plain(x, alias) for x in nest[-1].body)
            else:
                body = self.stmts(nest[-1].body, live, alias)
            loop = replace(nest[-1], body=body)
            for outer in reversed(nest[:-1]):
                loop = replace(outer, body=(loop,))
            staging = None
            rebuilt = parallel_nest(loop)
            st = rebuilt[-1].body[0]
            if how is not None and isinstance(st, Store):
                found = pieces(self.p, st.indices, rebuilt, split=0 if how else 1)
                pad = max(1, self.pad_bytes // st.buffer.dtype.itemsize) if self.pad_bytes else 0
                staging = Staging(found, how, pad) if found else None
            return replace(loop, staging=staging)
        if isinstance(s, Loop):
            return replace(s, body=self.stmts(s.body, live, alias))
        if isinstance(s, If):
            return replace(s, cond=self.expr(s.cond, alias), body=self.stmts(s.body, live, alias))
        return self.plain(s, alias)

    def plain(self, s: Stmt, alias: dict[Buffer, Buffer]) -> Stmt:
        """``s`` with its loads of mirrored accumulators read from their mirrors."""
        if not alias:
            return s
        if isinstance(s, Store):
            return replace(s, indices=tuple(self.expr(e, alias) for e in s.indices), value=self.expr(s.value, alias))
        if isinstance(s, Loop):
            return replace(s, body=tuple(self.plain(x, alias) for x in s.body))
        if isinstance(s, If):
            return replace(s, cond=self.expr(s.cond, alias), body=tuple(self.plain(x, alias) for x in s.body))
        return s

    def expr(self, e: Expr, alias: dict[Buffer, Buffer]) -> Expr:
        """``e`` with loads of ``alias``'s buffers retargeted; the same expression object for
        the same object (the printer names a shared subexpression once), ``e`` itself where
        nothing in it changes."""
        if not alias:
            return e
        memo = self.memo.setdefault(frozenset(alias.items()), {})
        hit = memo.get(id(e))
        if hit is not None:
            return hit
        out: Expr = e
        if isinstance(e, Load):
            indices = tuple(self.expr(i, alias) for i in e.indices)
            buffer = alias.get(e.buffer, e.buffer)
            if buffer != e.buffer or indices != e.indices:
                out = Load(buffer, indices)
        elif isinstance(e, IndexOp):
            a, b = self.expr(e.a, alias), self.expr(e.b, alias)
            out = e if a is e.a and b is e.b else IndexOp(e.op, a, b)
        elif isinstance(e, Call):
            args = tuple(self.expr(x, alias) for x in e.args)
            out = e if all(x is y for x, y in zip(args, e.args)) else Call(e.fn, args, e.dtype)
        elif isinstance(e, IndexCheck):
            index = self.expr(e.index, alias)
            out = e if index is e.index else IndexCheck(index, e.extent, e.site)
        memo[id(e)] = out
        return out

    def staged_how(self, s: Loop, live: set[Buffer]) -> bool | None:
        """Whether the nest headed by ``s`` is staged: True transposed, False plainly (it
        stores a live register accumulator's results to rectangles of a global output),
        None not."""
        entry = self.transposed.get(id(s))
        if entry is not None and entry[0] in live:
            return True
        nest = parallel_nest(s)
        body = nest[-1].body
        if not self.staged or len(body) != 1 or not isinstance(body[0], Store) or len(nest) != 2:
            return None
        st = body[0]
        if st.buffer.scope is not Scope.GLOBAL or not any(reads(st.value, b) for b in live):
            return None
        return False if pieces(self.p, st.indices, nest) else None


def _mirrored(p: TileProgram) -> bool:
    """Whether the pass made ``p``'s mirrors already (a bulk copy from an on-chip tile):
    mirrors are made once."""
    return any(isinstance(s, Copy) and s.bulk and s.src.buffer.scope is not Scope.GLOBAL for s in statements(p.body))


def _whole_copy(src: Buffer, dst: Buffer) -> Copy:
    zeros = tuple(const_index(0) for _ in src.shape)
    return Copy(Region(src, zeros, src.shape), Region(dst, zeros, dst.shape), bulk=True)


def pieces(p: TileProgram, indices: tuple[Expr, ...], loops: list[Loop], split: int = 1) -> tuple[Piece, ...] | None:
    """The rectangles of the output a two-loop nest of ``p`` writes at ``indices``: the
    whole tile where they are one region over it, else its columns (the nest's loop
    ``split``) in pieces of ``d``, where the output index divides the column by ``d`` (a
    128-column tile of two 64-wide heads written [batch, head, seq, d]); None if neither."""
    cols, rows = loops[split], loops[1 - split]
    whole = rectangle(indices, loops)
    if whole is not None:
        return (Piece(0, cols.extent, tuple(whole)),)
    divisors = {int(x.b.value) for e in indices for x in subexpressions(e)
                if isinstance(x, IndexOp) and x.op in (IOp.FLOORDIV, IOp.MOD) and isinstance(x.b, Const)
                and mentions(x.a, cols.var)}
    ranges = {v.name: g for v, g in zip(p.block_vars, p.grid)} | {rows.var.name: rows.extent}
    for d in sorted(divisors, reverse=True):
        if d >= cols.extent or cols.extent % d:
            continue
        inner = Loop(Var(f"{cols.var.name}_in"), d, LoopKind.PARALLEL, ())
        nest = [rows, inner] if split == 1 else [inner, rows]
        out = []
        for j0 in range(0, cols.extent, d):
            env: dict[Var, Expr] = {cols.var: iop(IOp.ADD, j0, inner.var)}
            idx = tuple(simplify_expr(substitute(e, env), ranges | {inner.var.name: d}) for e in indices)
            where = rectangle(idx, nest)
            if where is None:
                break
            out.append(Piece(j0, d, tuple(where)))
        else:
            return tuple(out)
    return None


def _transposed_stores(p: TileProgram, acc: Buffer) -> dict[int, tuple[Buffer, tuple[Piece, ...]]]:
    """Epilogue nests over (columns, rows) of ``acc`` that store ``f(acc[row, col])`` to a
    rectangle (or per-head rectangles) of a global output whose contiguous axis runs along
    the rows, by the id of the nest's head."""
    out: dict[int, tuple[Buffer, tuple[Piece, ...]]] = {}
    for s in statements(p.body):
        if not (isinstance(s, Loop) and s.kind is LoopKind.PARALLEL):
            continue
        nest = parallel_nest(s)
        body = nest[-1].body
        if len(nest) != 2 or tuple(l.extent for l in nest) != acc.shape[::-1] or len(body) != 1:
            continue
        st = body[0]
        if not isinstance(st, Store) or st.buffer.scope is not Scope.GLOBAL or not reads(st.value, acc):
            continue
        cols, rows = nest
        if any(reads(i, acc) for i in st.indices) or any(
                isinstance(y, Load) and y.buffer == acc and y.indices != (rows.var, cols.var)
                for y in subexpressions(st.value)):
            continue
        found = pieces(p, st.indices, nest, split=0)
        if found:
            out[id(s)] = (acc, found)
    return out


def own_element_epilogue(stmts: tuple[Stmt, ...], acc: Buffer, staged: dict) -> bool:
    """Every read of accumulator ``acc`` after its last product is ``acc[i, j]`` inside a
    parallel nest over exactly ``acc``'s shape (i, j its loop variables in order), or in a
    nest of ``staged`` (transposed stores, which read registers in the accumulator's order)."""
    return all(_own_reads_only(s, acc, staged) for s in stmts[_last_gemm(stmts, acc.name) + 1:])


def _mirrored_branches(stmts: tuple[Stmt, ...], acc: Buffer, staged: dict) -> list[If] | None:
    """Where the epilogue after ``acc``'s last product is branches of which only some read
    other threads' elements: those branches; None where a read outside a branch needs the
    mirror."""
    out = []
    for s in stmts[_last_gemm(stmts, acc.name) + 1:]:
        if _own_reads_only(s, acc, staged):
            continue
        if not isinstance(s, If) or reads(s.cond, acc):
            return None
        out.append(s)
    return out


def _own_reads_only(s: Stmt, acc: Buffer, staged: dict) -> bool:
    """Every read of ``acc`` in ``s`` is a thread's own element (see own_element_epilogue)."""
    if id(s) in staged and staged[id(s)][0] == acc:
        return True
    if isinstance(s, If):
        return not reads(s.cond, acc) and all(_own_reads_only(x, acc, staged) for x in s.body)
    nest = parallel_nest(s) if isinstance(s, Loop) and s.kind is LoopKind.PARALLEL else []
    if tuple(l.extent for l in nest) != acc.shape:
        return not any(stmt_reads(x, acc) for x in statements((s,)))
    own = tuple(l.var for l in nest)
    for x in nest[-1].body:
        if isinstance(x, Loop):  # a loop inside the nest: no reads at all
            if any(stmt_reads(y, acc) for y in statements(x.body)):
                return False
        elif isinstance(x, Store) and any(isinstance(y, Load) and y.buffer == acc and y.indices != own
                                          for e in (x.value, *x.indices) for y in subexpressions(e)):
            return False
    return True


def _last_gemm(stmts: tuple[Stmt, ...], name: str) -> int:
    return max(i for i, st in enumerate(stmts) if name in _gemm_targets((st,)))


def _gemm_targets(stmts: tuple[Stmt, ...]) -> set[str]:
    return {s.c.name for s in statements(stmts) if isinstance(s, Gemm)}


def _reduce_buffers(stmts: tuple[Stmt, ...]) -> set[str]:
    return {b.name for s in statements(stmts) if isinstance(s, ReduceTile) for b in (s.src, s.dst)}


def check_staging(p: TileProgram, blocks: bool) -> None:
    """Raise GraphError where a loop carries a staging the printer cannot honour: on a
    device without blocks, on a loop that heads no nest of two loops storing one value to
    a global output, or with pieces that are not the rectangles its store writes."""
    heads = {id(s) for s in _heads(p.body)}
    for s in statements(p.body):
        if not isinstance(s, Loop) or s.staging is None:
            continue
        where = f"kernel {p.name}: the staged nest over {s.var.name}"
        if not blocks:
            raise GraphError(f"{where} is on a device without blocks")
        nest = parallel_nest(s) if s.kind is LoopKind.PARALLEL else []
        body = nest[-1].body if nest else ()
        if (id(s) not in heads or len(nest) != 2 or len(body) != 1 or not isinstance(body[0], Store)
                or body[0].buffer.scope is not Scope.GLOBAL):
            raise GraphError(f"{where} is no nest of two loops storing to a global output")
        found = pieces(p, body[0].indices, nest, split=0 if s.staging.transposed else 1)
        if found != s.staging.pieces or s.staging.pad < 0:
            raise GraphError(f"{where} copies out pieces {s.staging.pieces} (pad {s.staging.pad}), "
                             f"not the rectangles its store writes, {found}")


def _heads(stmts: tuple[Stmt, ...]) -> list[Loop]:
    """The heads of the parallel nests in ``stmts``, inner nests' included."""
    out: list[Loop] = []
    for s in stmts:
        if isinstance(s, Loop) and s.kind is LoopKind.PARALLEL:
            out.append(s)
            out += _heads(parallel_nest(s)[-1].body)
        elif isinstance(s, (Loop, If)):
            out += _heads(s.body)
    return out
