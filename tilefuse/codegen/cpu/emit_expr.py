"""Expressions to C with common-subexpression elimination and loop-invariant hoisting.

Tile IR expressions are frozen dataclasses that lowering shares freely, so a statement's
expressions form a DAG. ``ExprTable`` interns them by structure (with an ``id`` memo, so
a heavily shared DAG is walked once, never unfolded into a tree). ``StmtExprs`` then
renders one statement's roots:

- a subexpression used twice or more becomes a ``const`` temp, defined once, before the
  statement, in dependency order;
- a subexpression that does not depend on the innermost loops is hoisted in front of
  the outermost loop it does not depend on — unless it loads a buffer that loop writes;
- nothing under a WHERE branch is ever evaluated outside its guard (a load there may be
  out of range): branches render inline, with their own temps in a GNU statement
  expression ``({ ... })`` when they share subexpressions.

An IndexCheck is a call of the prelude's ``tf_index`` with the kernel's status word:
hoisting or sharing it is safe (its only effect, recording a bad index, is idempotent).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

from tilefuse.codegen.cpu.c_types import compute, literal, load
from tilefuse.codegen.cpu.ops import render_call, render_iop
from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ScalarFn
from tilefuse.tile_ir.ir import STATUS, Buffer, Call, Const, Expr, IndexCheck, IndexOp, IOp, Load, Var

_BOOL_IOPS = {IOp.LT, IOp.LE, IOp.GE, IOp.EQ, IOp.AND, IOp.OR}


@dataclass(frozen=True, slots=True)
class Node:
    """One distinct subexpression: ``kids`` are node ids; leaves carry their C text."""

    kind: type  # Var, Const, IndexOp, Load, Call or IndexCheck
    dtype: DType
    kids: tuple[int, ...] = ()
    op: object = None  # IOp, ScalarFn, the Buffer of a Load, or an IndexCheck's (extent, site)
    text: str = ""

    @property
    def is_leaf(self) -> bool:
        return self.kind is Var or self.kind is Const

    @property
    def is_where(self) -> bool:
        return self.kind is Call and self.op is ScalarFn.WHERE

    # ``op`` as the kind says it is: each accessor serves one kind and asserts it
    @property
    def value(self) -> float | int | bool:
        """A Const's value."""
        assert self.kind is Const and isinstance(self.op, (int, float)), self
        return self.op

    @property
    def iop(self) -> IOp:
        assert self.kind is IndexOp and isinstance(self.op, IOp), self
        return self.op

    @property
    def fn(self) -> ScalarFn:
        assert self.kind is Call and isinstance(self.op, ScalarFn), self
        return self.op

    @property
    def buffer(self) -> Buffer:
        """The buffer a Load reads."""
        assert self.kind is Load and isinstance(self.op, Buffer), self
        return self.op

    @property
    def check(self) -> tuple[int, int]:
        """An IndexCheck's (extent, site)."""
        assert self.kind is IndexCheck and isinstance(self.op, tuple), self
        return self.op


class ExprTable:
    """Interns expressions by structure; equal subexpressions get one node id."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self._ids: dict[Node, int] = {}
        self._memo: dict[int, tuple[int, Expr]] = {}  # id(expr) -> (node id, expr kept alive)

    def intern(self, e: Expr) -> int:
        hit = self._memo.get(id(e))
        if hit is not None and hit[1] is e:
            return hit[0]
        nid = self._add(self._node(e))
        self._memo[id(e)] = (nid, e)
        return nid

    def _add(self, node: Node) -> int:
        nid = self._ids.get(node)
        if nid is None:
            nid = self._ids[node] = len(self.nodes)
            self.nodes.append(node)
        return nid

    def const(self, value: int | bool, dtype: DType) -> int:
        return self._add(Node(Const, dtype, text=literal(value, dtype), op=value))

    def _node(self, e: Expr) -> Node:
        if isinstance(e, Var):
            return Node(Var, DType.INT64, text=cident(e.name))
        if isinstance(e, Const):
            return Node(Const, e.dtype, text=literal(e.value, e.dtype), op=e.value)
        if isinstance(e, IndexOp):
            dtype = DType.BOOL if e.op in _BOOL_IOPS else DType.INT64
            return Node(IndexOp, dtype, (self.intern(e.a), self.intern(e.b)), e.op)
        if isinstance(e, Load):
            return Node(Load, e.buffer.dtype, tuple(self.intern(i) for i in e.indices), e.buffer)
        if isinstance(e, Call):
            return Node(Call, e.dtype, tuple(self.intern(a) for a in e.args), e.fn)
        if isinstance(e, IndexCheck):
            return Node(IndexCheck, DType.INT64, (self.intern(e.index),), (e.extent, e.site))
        raise TypeError(f"unknown expression {e!r}")


@dataclass(slots=True)
class LoopLevel:
    """One enclosing loop, as statements inside it see it. ``pre`` collects the lines
    hoisted in front of it; ``temps`` the node ids they define (valid inside it)."""

    var: str
    extent: int
    writes: frozenset[str]  # buffers written anywhere inside the loop
    movable: bool = True  # False for the inner loops of an ``omp ... collapse`` nest
    pre: list[str] = field(default_factory=list)
    temps: dict[int, str] = field(default_factory=dict)


_C_RESERVED = {
    "auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else", "enum", "extern",
    "float", "for", "goto", "if", "inline", "int", "long", "register", "restrict", "return", "short", "signed",
    "sizeof", "static", "struct", "switch", "typedef", "union", "unsigned", "void", "volatile", "while", "args",
    # library functions generated code calls (a local of that name would shadow them)
    "memset", "memcpy", "free", "aligned_alloc", "abort", "fputs", "stderr", "isnan", "isinf", "main",
} | {f"{base}{sfx}" for base in ("sqrt", "exp", "log", "floor", "ceil", "rint", "erf", "tanh", "sin", "cos", "tan",
                                  "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "fabs", "fmod",
                                  "pow", "copysign") for sfx in ("", "f")}


def cident(name: str) -> str:
    """``name`` as a C identifier that cannot clash with the emitter's own names (temps
    ``t<n>``, copy indices ``c<n>``, locals ``_x``, helpers ``tf_*``), C keywords, the
    library functions kernels call, types (``*_t``) or macros (upper case)."""
    text = re.sub(r"[^A-Za-z0-9_]", "_", name) or "_"
    if (text[0].isdigit() or text in _C_RESERVED or re.fullmatch(r"[tc][0-9]+", text)
            or text.startswith(("tf_", "_")) or text.endswith("_t") or text.isupper()):
        text = "v_" + text
    return text


class Names:
    def __init__(self) -> None:
        self.n = 0

    def temp(self, prefix: str = "t") -> str:
        self.n += 1
        return f"{prefix}{self.n}"


def flat_index(indices: Sequence[str], shape: Sequence[int]) -> str:
    """Row-major offset of ``indices`` into ``shape`` (int64 arithmetic, zero terms dropped)."""
    terms, stride = [], 1
    for i, d in reversed(list(zip(indices, shape))):
        if i != "0":
            terms.append(i if stride == 1 else f"{i} * {stride}")
        stride *= d
    return " + ".join(reversed(terms)) or "0"


class _Scope:
    """Where temps go: before a loop (hoisted), before the statement, or inside a WHERE
    branch. ``level`` is the loop depth its code runs at; a branch scope never hoists."""

    def __init__(self, parent: _Scope | None, level: int, lines: list[str], temps: dict[int, str],
                 counts: Counter, guarded: bool) -> None:
        self.parent, self.level, self.lines, self.temps = parent, level, lines, temps
        self.counts, self.guarded = counts, guarded

    def lookup(self, nid: int) -> str | None:
        s: _Scope | None = self
        while s is not None:
            if nid in s.temps:
                return s.temps[nid]
            s = s.parent
        return None


class StmtExprs:
    """Renders the expressions of one statement at depth ``len(levels)``.

    ``ranges`` gives each loop / block variable's [lo, hi]; it lets index arithmetic drop
    floor corrections (and identities such as ``i % 16`` for ``i < 16``).
    """

    def __init__(self, table: ExprTable, names: Names, levels: Sequence[LoopLevel], ranges: dict[str, tuple[int, int]],
                 roots: Sequence[int], buffer_name: Callable[[Buffer], str]) -> None:
        self.t, self.names, self.levels, self.ranges = table, names, list(levels), ranges
        self.buffer_name = buffer_name
        self._bounds: dict[int, tuple[int, int] | None] = {}
        self._simple: dict[int, int] = {}
        self._level: dict[int, int] = {}
        self.var_level = {lv.var: k + 1 for k, lv in enumerate(self.levels)}
        self.roots = [self.simplify(r) for r in roots]
        outer, counts = self._region(self.roots)
        self.outer = outer
        # loop scopes: hoisted temps of loop k live in levels[k].pre, visible inside it
        parent: _Scope | None = None
        self.loop_scopes: list[_Scope] = []
        for k, lv in enumerate(self.levels):
            parent = _Scope(parent, k, lv.pre, lv.temps, counts, False)
            self.loop_scopes.append(parent)
        self.lines: list[str] = []
        self.scope = _Scope(parent, len(self.levels), self.lines, {}, counts, False)

    # -- public ------------------------------------------------------------------------
    def root(self, k: int) -> str:
        """C text of root ``k``; temps it needs are in ``self.lines`` or hoisted."""
        return self.ref(self.roots[k], self.scope)

    def bounds(self, nid: int) -> tuple[int, int] | None:
        if nid not in self._bounds:
            self._bounds[nid] = self._compute_bounds(nid)
        return self._bounds[nid]

    # -- simplification by ranges ---------------------------------------------------------
    def simplify(self, nid: int) -> int:
        """``a % d`` with ``0 <= a < d`` is ``a``; ``a // d`` is 0 there (d a constant);
        ``min(a, c)`` with ``a <= c`` and ``max(a, c)`` with ``a >= c`` are ``a``."""
        if nid in self._simple:
            return self._simple[nid]
        n, out = self.t.nodes[nid], nid
        if n.kind is IndexOp and n.op in (IOp.MOD, IOp.FLOORDIV):
            b = self.t.nodes[n.kids[1]]
            ab = self.bounds(n.kids[0])
            if b.kind is Const and ab is not None and 0 <= ab[0] and ab[1] < int(b.value):
                out = self.simplify(n.kids[0]) if n.op is IOp.MOD else self.t.const(0, DType.INT64)
        elif n.kind is IndexOp and n.op in (IOp.MIN, IOp.MAX):
            b = self.t.nodes[n.kids[1]]
            ab = self.bounds(n.kids[0])
            if b.kind is Const and ab is not None and (ab[1] <= int(b.value) if n.op is IOp.MIN else ab[0] >= int(b.value)):
                out = self.simplify(n.kids[0])
        self._simple[nid] = out
        return out

    def kids(self, nid: int) -> tuple[int, ...]:
        return tuple(self.simplify(k) for k in self.t.nodes[nid].kids)

    def _compute_bounds(self, nid: int) -> tuple[int, int] | None:
        n = self.t.nodes[nid]
        if n.kind is Var:
            return self.ranges.get(n.text)
        if n.kind is Const:
            return (int(n.value), int(n.value)) if n.dtype.is_int else None
        if n.kind is IndexCheck:
            return (0, n.check[0] - 1)
        if n.kind is not IndexOp:
            if n.is_where and n.dtype is DType.INT64:
                a, b = self.bounds(n.kids[1]), self.bounds(n.kids[2])
                return (min(a[0], b[0]), max(a[1], b[1])) if a and b else None
            return None
        if n.op in _BOOL_IOPS:
            return (0, 1)
        a, b = self.bounds(n.kids[0]), self.bounds(n.kids[1])
        if a is None or b is None:
            return None
        if n.op is IOp.ADD:
            return (a[0] + b[0], a[1] + b[1])
        if n.op is IOp.SUB:
            return (a[0] - b[1], a[1] - b[0])
        if n.op is IOp.MUL:
            p = [x * y for x in a for y in b]
            return (min(p), max(p))
        if n.op in (IOp.MIN, IOp.MAX):
            f = min if n.op is IOp.MIN else max
            return (f(a[0], b[0]), f(a[1], b[1]))
        if b[0] == b[1] and b[0] > 0:
            if n.op is IOp.MOD:
                return (0, b[0] - 1)
            return (a[0] // b[0], a[1] // b[0])
        return None

    # -- regions: what a scope evaluates unconditionally ------------------------------------
    def _region(self, roots: Sequence[int]) -> tuple[set[int], Counter]:
        """Nodes reachable from ``roots`` without entering a WHERE branch, and how often each
        is referenced (from this region, and from the branches below it)."""
        region: set[int] = set()
        stack = list(roots)
        while stack:
            nid = stack.pop()
            if nid in region:
                continue
            region.add(nid)
            n = self.t.nodes[nid]
            kids = self.kids(nid)
            stack.extend(kids[:1] if n.is_where else kids)
        counts: Counter = Counter(roots)
        branch_roots: list[int] = []
        for nid in region:
            kids = self.kids(nid)
            if self.t.nodes[nid].is_where:
                counts[kids[0]] += 1
                branch_roots += kids[1:]
            else:
                counts.update(kids)
        seen: set[int] = set()  # references from guarded code into this region
        stack = branch_roots
        while stack:
            nid = stack.pop()
            if nid in region:
                counts[nid] += 1
                continue
            if nid in seen:
                continue
            seen.add(nid)
            stack.extend(self.kids(nid))
        return region, counts

    # -- hoisting ----------------------------------------------------------------------
    def level(self, nid: int) -> int:
        """The loop depth a node can be computed at: deep enough for its variables, and
        inside every loop that writes a buffer it loads."""
        if nid in self._level:
            return self._level[nid]
        n = self.t.nodes[nid]
        if n.kind is Var:
            lv = self.var_level.get(n.text, 0)
        elif n.kind is Const:
            lv = 0
        else:
            lv = max((self.level(k) for k in self.kids(nid)), default=0)
            if n.kind is Load:
                name = n.buffer.name
                for k in range(len(self.levels) - 1, lv - 1, -1):
                    if name in self.levels[k].writes:
                        lv = k + 1
                        break
        # code cannot go between the loops of a collapsed nest: sink into its innermost body
        while lv < len(self.levels) and not self.levels[lv].movable:
            lv += 1
        self._level[nid] = lv
        return lv

    # -- rendering ---------------------------------------------------------------------
    def ref(self, nid: int, scope: _Scope) -> str:
        n = self.t.nodes[nid]
        if n.is_leaf:
            return n.text
        found = scope.lookup(nid)
        if found is not None:
            return found
        if scope.guarded and nid in self.outer:  # evaluated unconditionally anyway: share it
            while scope.guarded:
                assert scope.parent is not None  # a branch's scope sits inside its statement's
                scope = scope.parent
        if not scope.guarded:
            lv = self.level(nid)
            if lv < scope.level:
                return self._define(nid, self.loop_scopes[lv])
        if scope.counts[nid] >= 2:
            return self._define(nid, scope)
        return self.render(nid, scope)

    def _define(self, nid: int, scope: _Scope) -> str:
        text = self.render(nid, scope)
        name = self.names.temp()
        scope.lines.append(f"const {compute(self.t.nodes[nid].dtype)} {name} = {text};")
        scope.temps[nid] = name
        return name

    def render(self, nid: int, scope: _Scope) -> str:
        n = self.t.nodes[nid]
        kids = self.kids(nid)
        if n.kind is Load:
            buf = n.buffer
            idx = [self.ref(k, scope) for k in kids]
            return load(buf.dtype, f"{self.buffer_name(buf)}[{flat_index(idx, buf.shape)}]")
        if n.kind is IndexOp:
            a, b = (self.ref(k, scope) for k in kids)
            ab, bn = self.bounds(kids[0]), self.t.nodes[kids[1]]
            pos_const = bn.kind is Const and int(bn.value) > 0
            return render_iop(n.iop, a, b, ab is not None and ab[0] >= 0, pos_const)
        if n.kind is IndexCheck:
            extent, site = n.check
            return f"tf_index({self.ref(kids[0], scope)}, {extent}, {cident(STATUS.name)}, {site})"
        if n.is_where:
            cond = self.ref(kids[0], scope)
            return f"({cond} ? {self._guarded(kids[1], scope)} : {self._guarded(kids[2], scope)})"
        args = [self.ref(k, scope) for k in kids]
        return render_call(n.fn, args, [self.t.nodes[k].dtype for k in kids], n.dtype)

    def _guarded(self, nid: int, parent: _Scope) -> str:
        """A WHERE branch: evaluated only when taken, with temps of its own if it needs them."""
        n = self.t.nodes[nid]
        if n.is_leaf or parent.lookup(nid) is not None:
            return self.ref(nid, parent)
        _, counts = self._region([nid])
        scope = _Scope(parent, parent.level, [], {}, counts, True)
        text = self.ref(nid, scope)
        if not scope.lines:
            return text
        return "({ " + " ".join(scope.lines) + f" {text}; }})"
