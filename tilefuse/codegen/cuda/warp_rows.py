"""Row reductions as whole warps per row: the CUDA form of the row schedule's programs.

The row schedule (``tile_ir/lower/rows.py``) writes a norm or a softmax as tiles of ``br``
whole rows of ``E``: per reduction, a parallel nest fills a ``(br, E)`` tile that a
ReduceTile folds into a per-row buffer ``(br,)``; then parallel nests over ``(br, width)``
write the outputs, reading the per-row results at their own row. The generic emission
keeps that tile and the reduction's partials in shared memory and lets one thread per row
fold the partials: latency-bound. Where the program says so (``TileProgram.row_lanes``,
set by tile_ir/passes/rows.py, which also says what shape such a program has), each row
gets ``L = row_lanes`` lanes, whole warps, and the tile never exists:

    fill + ReduceTile  -> every lane folds its elements ``j = jj * L + lane`` (neighbouring
                          lanes read neighbouring elements) into a register, the warp
                          combines its lanes with ``T.warp_reduce_*`` (shuffles; every lane
                          gets the result) and, with several warps per row, the warps'
                          results meet in a small shared array after one barrier
    per-row buffer     -> a register; every lane of the row holds the row's value
    output nest        -> every lane writes its elements ``j = jj * L + lane``; a per-row
                          output (width 1) is written by lane 0
    a global element   -> read once: a lane loads its elements of a row into registers
    several steps read    before the first step (``CudaOptions.cache_rows``), and the steps read those
                          registers (a LayerNorm reads its input for the mean, the variance
                          and the output)

Where ``row_lanes`` is 0 ``warp_rows`` returns None and the generic emission runs.
"""
from __future__ import annotations

from typing import Protocol

from tilefuse.codegen.options import CudaOptions
from tilefuse.device import Device
from tilefuse.errors import CompileError
from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ReduceFn, ScalarFn
from tilefuse.tile_ir.ir import Buffer, Call, Expr, Load, ReduceTile, Stmt, TileProgram, Var, children, subexpressions, substitute
from tilefuse.tile_ir.passes.rows import RowNest, RowPlan, row_plan


# the fold of one lane's terms (its text and identity) and the warp's shuffle reduction,
# for each of tile_ir.passes.rows.WARP_REDUCTIONS
_FOLD = {ReduceFn.SUM: ("({a} + {b})", 0.0, "T.warp_reduce_sum"),
         ReduceFn.MAX: ("T.max({a}, {b})", float("-inf"), "T.warp_reduce_max"),
         ReduceFn.MIN: ("T.min({a}, {b})", float("inf"), "T.warp_reduce_min")}


class Emitter(Protocol):
    """What this module uses of the CUDA emitter (emit._Emitter, on exprs.ExprPrinter): names, typed constants,
    expression rendering with let lines, statement rendering, and loads it reads from a
    register instead of their buffer."""

    p: TileProgram
    options: CudaOptions
    device: Device
    replaced: dict[tuple[str, tuple[Expr, ...]], str]

    def name(self, b: Buffer | Var) -> str: ...
    def temp(self) -> str: ...
    def const(self, value: float | bool, dtype: DType) -> str: ...
    def render(self, roots: list[Expr], is_index: list[bool]) -> tuple[list[str], list[str]]: ...
    def stmt(self, s: Stmt, depth: int) -> list[str]: ...


def warp_rows(em: Emitter, depth: int) -> list[str] | None:
    """The kernel body (inside ``T.Kernel``, at ``depth``) of a row program the program
    says to lay out as whole warps per row (``row_lanes``: tile_ir/passes/rows.py), or
    None where it says not."""
    if not em.p.row_lanes:
        return None
    plan = row_plan(em.p, em.p.row_lanes)
    if plan is None or not em.device.warp or plan.lanes % em.device.warp:  # what the verifier ensures
        raise CompileError(f"kernel {em.p.name}: {em.p.row_lanes} lanes a row, but it is no row program of whole warps")
    return _Writer(em, plan, depth).lines()


class _Writer:
    def __init__(self, em: Emitter, plan: RowPlan, depth: int) -> None:
        self.em, self.plan, self.depth = em, plan, depth
        self.ind = " " * 4 * depth
        self.shared: list[str] = []  # the warps' meeting arrays, allocated before the body
        self.runs: list[str] = []  # per-lane registers of vector runs

    def lines(self) -> list[str]:
        em, plan, ind = self.em, self.plan, self.ind
        out = [f"{ind}_tx = T.get_thread_binding()",
               f"{ind}_row = _tx // {plan.lanes}  # the tile's row this thread works on",
               f"{ind}_lane = _tx % {plan.lanes}"]
        for b in plan.row_buffers:  # a register per thread: every lane of a row holds its value
            out.append(f'{ind}{em.name(b)} = T.alloc_local((1,), "{b.dtype.value}")')
        for step in plan.steps:
            st = step.nest.store
            for x in (y for e in (st.value, *st.indices) for y in subexpressions(e)):
                if isinstance(x, Load) and x.buffer in plan.row_buffers:
                    em.replaced[(x.buffer.name, x.indices)] = f"{em.name(x.buffer)}[0]"
        self.width = max(st.nest.width for st in plan.steps)  # the row's (per-row outputs: 1)
        self.cache = self.cached()
        body: list[str] = []
        for step in plan.steps:
            body.append(f"{ind}{em.name(step.nest.row)} = _row")
            body += self.reduction(step.nest, step.reduce) if step.reduce else self.output(step.nest)
        return out + self.shared + self.runs + self.preload() + body

    # -- global elements read once ---------------------------------------------------------
    _ROW, _COL = Var("_cache_row"), Var("_cache_col")

    def canonical(self, nest: RowNest, x: Load) -> Load:
        out = substitute(x, {nest.row: self._ROW, nest.col: self._COL})
        assert isinstance(out, Load)  # substituting variables keeps a load a load
        return out

    def global_loads(self, nest: RowNest) -> list[Load]:
        """The nest's loads of global elements along its row, outside WHERE branches (a
        branch's loads may be out of range where it is not taken: they stay where they are)."""
        params = set(self.em.p.params)
        return [x for x in _unconditional(nest.store.value) if isinstance(x, Load) and x.buffer in params
                and nest.col in _vars(x)]

    def cached(self) -> dict[Load, tuple[str, int]]:
        """Global elements (canonical: the nest's row and column as two fixed variables)
        that more than one full-width step reads, each with the register array holding a
        lane's share of the row and the run length the steps read them in. Only where
        every such step splits the row the same way: the array's slot of an element is
        then the same in each."""
        if not self.em.options.cache_rows:
            return {}
        readers: dict[Load, list[RowNest]] = {}
        for st in self.plan.steps:
            if st.nest.width == self.width:
                for x in dict.fromkeys(self.canonical(st.nest, x) for x in self.global_loads(st.nest)):  # in order
                    readers.setdefault(x, []).append(st.nest)
        out: dict[Load, tuple[str, int]] = {}
        for x, nests in readers.items():
            runs = {self.run_length(n) for n in nests}
            if len(nests) > 1 and len(runs) == 1:
                out[x] = (f"_row_in{len(out)}", runs.pop())
        return out

    def preload(self) -> list[str]:
        """Each cached element into its register array, before the first step."""
        em, ind = self.em, self.ind
        out: list[str] = []
        for x, (reg, v) in self.cache.items():
            count = self.width // self.plan.lanes
            out.append(f'{ind}{reg} = T.alloc_local(({count},), "{x.buffer.dtype.value}")')
            rv, cv = Var(f"{reg}_r"), Var(f"{reg}_c")
            row, col = em.name(rv), em.name(cv)
            local = substitute(x, {self._ROW: rv, self._COL: cv})
            head, jj = self.lanes_loop(count // v)
            lets, (value,) = em.render([local], [False])
            out += [f"{ind}{row} = _row", f"{ind}{head}"]
            if v == 1:
                out += [f"{ind}    {col} = {self.column(None, jj, 1, '')}", *(f"{ind}    {t}" for t in lets),
                        f"{ind}    {reg}[{jj}] = {value}"]
            else:
                vv = em.temp()
                out += [f"{ind}    for {vv} in T.vectorized({v}):",
                        f"{ind}        {col} = {self.column(None, jj, v, vv)}", *(f"{ind}        {t}" for t in lets),
                        f"{ind}        {reg}[{jj} * {v} + {vv}] = {value}"]
        return out

    def bind(self, nest: RowNest, jj: str, vv: str, v: int) -> list[tuple[str, tuple[Expr, ...]]]:
        """Point the nest's cached loads at their registers for its rendering; the keys,
        to unbind after."""
        keys = []
        for x in self.global_loads(nest):
            hit = self.cache.get(self.canonical(nest, x))
            if hit is not None and hit[1] == v and nest.width == self.width:
                key = (x.buffer.name, x.indices)
                self.em.replaced[key] = f"{hit[0]}[{jj}]" if v == 1 else f"{hit[0]}[{jj} * {v} + {vv}]"
                keys.append(key)
        return keys

    def unbind(self, keys: list[tuple[str, tuple[Expr, ...]]]) -> None:
        for key in keys:
            self.em.replaced.pop(key, None)

    def lanes_loop(self, count: int) -> tuple[str, str]:
        """The per-lane loop head over ``count`` elements (or runs) per lane and its variable."""
        jj = self.em.temp()
        kind = "T.unroll" if count <= self.em.options.max_unroll else "T.serial"
        return f"for {jj} in {kind}({count}):", jj

    def run_length(self, nest: RowNest) -> int:
        """Elements a lane takes at a time: ``vector_bytes`` of the narrowest type the nest
        reads from global memory, where the width splits into whole runs for every lane."""
        sizes = [x.buffer.dtype.itemsize for e in (nest.store.value,) for x in subexpressions(e)
                 if isinstance(x, Load) and x.buffer in self.em.p.params]
        vector = self.em.options.vector_bytes
        if not vector or not sizes:
            return 1
        v = max(1, vector // min(sizes))
        while v > 1 and nest.width % (self.plan.lanes * v):
            v //= 2
        return v

    def column(self, nest: RowNest | None, jj: str, v: int, vv: str) -> str:
        """The column a lane's element ``vv`` of run ``jj`` sits at."""
        lanes = self.plan.lanes
        return f"{jj} * {lanes} + _lane" if v == 1 else f"({jj} * {lanes} + _lane) * {v} + {vv}"

    def reduction(self, nest: RowNest, red: ReduceTile) -> list[str]:
        em, ind, lanes = self.em, self.ind, self.plan.lanes
        combine, identity, shuffle = _FOLD[red.fn]
        dt = red.dst.dtype
        acc = f"{em.name(red.dst)}[0]"
        v = self.run_length(nest)
        head, jj = self.lanes_loop(nest.width // (lanes * v))
        vv = em.temp() if v > 1 else ""
        keys = self.bind(nest, jj, vv, v)
        lets, (value,) = em.render([nest.store.value], [False])
        self.unbind(keys)
        out = [f"{ind}{acc} = {em.const(identity, dt)}", f"{ind}{head}"]
        if v == 1:
            out += [f"{ind}    {em.name(nest.col)} = {self.column(nest, jj, 1, '')}"]
            out += [f"{ind}    {x}" for x in lets]
            out += [f"{ind}    {acc} = {combine.format(a=acc, b=value)}"]
        else:  # the run's terms into registers with one vector load, then folded in order
            run = f"_run{len(self.runs)}"
            self.runs.append(f'{ind}{run} = T.alloc_local(({v},), "{dt.value}")')
            out += [f"{ind}    for {vv} in T.vectorized({v}):",
                    f"{ind}        {em.name(nest.col)} = {self.column(nest, jj, v, vv)}"]
            out += [f"{ind}        {x}" for x in lets]
            out += [f"{ind}        {run}[{vv}] = {value}",
                    f"{ind}    for {vv} in T.unroll({v}):",
                    f"{ind}        {acc} = {combine.format(a=acc, b=f'{run}[{vv}]')}"]
        out += [f"{ind}{acc} = {shuffle}({acc})"]
        warp = em.device.warp
        warps = lanes // warp
        if warps == 1:
            return out
        # the row's warps meet in shared memory: one array per reduction, so no warp
        # overwrites a value another has yet to read
        part = f"_warps{len(self.shared)}"
        self.shared.append(f'{ind}{part} = T.alloc_shared(({self.plan.rows}, {warps}), "{dt.value}")')
        w = em.temp()
        return out + [f"{ind}if _lane % {warp} == 0:",
                      f"{ind}    {part}[_row, _lane // {warp}] = {acc}",
                      f"{ind}T.sync_threads()",
                      f"{ind}{acc} = {part}[_row, 0]",
                      f"{ind}for {w} in T.serial(1, {warps}):",
                      f"{ind}    {acc} = {combine.format(a=acc, b=f'{part}[_row, {w}]')}"]

    def output(self, nest: RowNest) -> list[str]:
        em, ind, lanes = self.em, self.ind, self.plan.lanes
        if nest.width == 1:  # a per-row value: lane 0 writes it
            return [f"{ind}if _lane == 0:",
                    f"{ind}    {em.name(nest.col)} = 0",
                    *em.stmt(nest.store, self.depth + 1)]
        v = self.run_length(nest)
        head, jj = self.lanes_loop(nest.width // (lanes * v))
        if v == 1:
            keys = self.bind(nest, jj, "", 1)
            store = em.stmt(nest.store, self.depth + 1)
            self.unbind(keys)
            return [f"{ind}{head}",
                    f"{ind}    {em.name(nest.col)} = {self.column(nest, jj, 1, '')}",
                    *store]
        vv = em.temp()
        keys = self.bind(nest, jj, vv, v)
        store = em.stmt(nest.store, self.depth + 2)
        self.unbind(keys)
        return [f"{ind}{head}",
                f"{ind}    for {vv} in T.vectorized({v}):",
                f"{ind}        {em.name(nest.col)} = {self.column(nest, jj, v, vv)}",
                *store]


def _vars(e: Expr) -> set[Var]:
    return {x for x in subexpressions(e) if isinstance(x, Var)}


def _unconditional(e: Expr) -> list[Expr]:
    """``e`` and the expressions inside it that are evaluated whatever a WHERE decides (its
    condition, not its branches)."""
    out = [e]
    if isinstance(e, Call) and e.fn is ScalarFn.WHERE:
        return out + _unconditional(e.args[0])
    for c in children(e):
        out += _unconditional(c)
    return out
