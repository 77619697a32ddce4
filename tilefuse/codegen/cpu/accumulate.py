"""Running reductions kept in a register: a C-side rewrite of one loop-nest shape.

The staged and window schedules reduce with ``for k: buf[i] = f(buf[i], x[k])``: a store
and a reload of the same tile element on every step, which the C compiler keeps in memory
(the tile buffer is shared by the OpenMP region), so each step waits on the last one's
store. When a nest of serial loops ends in exactly that store, and the element's index
does not depend on the nest, the nest becomes

    acc[0] = buf[i];  for k: acc[0] = f(acc[0], x[k]);  buf[i] = acc[0];

with ``acc`` a one-element local array (private to the iteration, so the compiler keeps
it in a register). The same stores happen in the same order: semantics are unchanged.
"""
from __future__ import annotations

from dataclasses import replace

from tilefuse.tile_ir.ir import (Buffer, Call, Expr, IndexCheck, IndexOp, Load, Loop, LoopKind, Scope, Stmt, Store, Var, children,
                                 const_index, subexpressions)


def running_reduction(loop: Loop, local: frozenset[str], name: str) -> tuple[Buffer, list[Stmt]] | None:
    """The accumulator and the statements replacing ``loop``, or None if it is not a nest
    of serial loops around one ``buf[i] = f(buf[i], ...)`` on a local tile buffer."""
    nest, inner = [loop], loop
    while True:
        if inner.kind is not LoopKind.SERIAL or len(inner.body) != 1:
            return None
        (s,) = inner.body
        if isinstance(s, Loop):
            nest.append(s)
            inner = s
            continue
        break
    if not isinstance(s, Store) or s.buffer.name not in local:
        return None
    nest_vars = {l.var.name for l in nest}
    if any(_uses(i, nest_vars) for i in s.indices):
        return None
    here = Load(s.buffer, s.indices)
    if not _contains(s.value, here) or _reads_other(s.value, s.buffer, here):
        return None
    acc = Buffer(name, s.buffer.dtype, (1,), Scope.FRAGMENT)
    at = (const_index(0),)
    body: Stmt = Store(acc, at, _swap(s.value, here, Load(acc, at)))
    for l in reversed(nest):
        body = replace(l, body=(body,))
    return acc, [Store(acc, at, here), body, Store(s.buffer, s.indices, Load(acc, at))]


def _uses(e: Expr, names: set[str]) -> bool:
    return any(isinstance(x, Var) and x.name in names for x in subexpressions(e))


def _contains(e: Expr, target: Expr) -> bool:
    return any(x == target for x in subexpressions(e))


def _reads_other(e: Expr, buf: Buffer, here: Load) -> bool:
    """Whether ``e`` reads ``buf`` anywhere but at the accumulated element."""
    if e == here:
        return False
    if isinstance(e, Load) and e.buffer == buf:
        return True
    return any(_reads_other(c, buf, here) for c in children(e))


def _swap(e: Expr, old: Expr, new: Expr) -> Expr:
    if e == old:
        return new
    if isinstance(e, IndexOp):
        return IndexOp(e.op, _swap(e.a, old, new), _swap(e.b, old, new))
    if isinstance(e, Load):
        return Load(e.buffer, tuple(_swap(i, old, new) for i in e.indices))
    if isinstance(e, Call):
        return Call(e.fn, tuple(_swap(a, old, new) for a in e.args), e.dtype)
    if isinstance(e, IndexCheck):
        return IndexCheck(_swap(e.index, old, new), e.extent, e.site)
    return e
