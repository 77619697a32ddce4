"""TileProgram -> C11 (GNU dialect): one kernel function with the CPU ABI.

    void SYMBOL(void **args)   /* args[i]: base of program.params[i], dense row-major */

The tile grid is a loop nest, OpenMP-parallel when it has more than one tile and enough
work (``CpuOptions.parallel_min_work``); per-tile buffers are local arrays (heap-allocated above
``CpuOptions.stack_buffer_bytes``) that start zeroed, as the interpreter's do. A parallel loop nest big enough to pay for a parallel region,
and not already inside one, becomes ``omp parallel for collapse(k)``; an innermost
parallel loop of plain stores gets ``omp simd`` (in whole steps with the last moved back,
where a costly loop's tail would be scalar: ``CpuOptions.overlap_tail``). A kernel with a
parallel loop carries the thread pool its loops run on (``threads``), so it needs no OpenMP
runtime. Tile statements (Copy, Fill, Gemm, the host's products, Transpose, LaneTaps, PlaneTaps,
Winograd, ReduceTile) are rendered by ``emit_tiles``.

The result is a ``CSource``: text, symbol and params, built from the IR. The symbol is
the program's name without its group index plus a hash of everything else, so identical
layers of a model share one kernel (and one compile).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from typing import Sequence

from tilefuse import cpu_isa
from tilefuse.codegen.artifact import ParamSpec
from tilefuse.codegen.cpu import accumulate, block_epilogues, emit_tiles, first_products
from tilefuse.codegen.cpu.c_types import storage, store_as
from tilefuse.codegen.cpu.emit_expr import ExprTable, LoopLevel, Names, StmtExprs, cident, flat_index
from tilefuse.codegen.cpu.prelude import (INDEX_PRELUDE, INT8_PANEL_PRELUDE, PANEL_PRELUDE, PLANE_TAPS_PRELUDE, PRELUDE,
                                         ROW_BLOCKS_PRELUDE, TAP_PRELUDE, TRANSPOSE_PRELUDE, WINOGRAD_PRELUDE)
from tilefuse.codegen.cpu.flat_access import flatten_accesses
from tilefuse.codegen.cpu.threads import THREAD_POOL
from tilefuse.codegen.launch import CpuLaunch
from tilefuse.codegen.options import CpuOptions
from tilefuse.codegen.toolchain import kernel_stem, param_specs
from tilefuse.ir.prims import ScalarFn
from tilefuse.tile_ir.ir import (STATUS, Buffer, Call, Const, Copy, Expr, Fill, Gemm, If, IndexOp, IOp, LaneTaps, Loop, LoopKind,
                                 PanelGemm, PlaneTaps, ReduceTile, Stmt, Store, StridedGemm, TapGemm, TileProgram, Transpose, Var, Winograd,
                                 statements, subexpressions)
from tilefuse.tile_ir.nests import stmt_reads

@dataclass(frozen=True)
class CSource:
    """One emitted kernel: its C text, exported symbol, parameters and launch record."""

    text: str
    symbol: str
    params: tuple[ParamSpec, ...]
    launch: CpuLaunch


def emit_program(program: TileProgram, options: CpuOptions = CpuOptions()) -> CSource:
    stem = kernel_stem(program.name)
    emitter = _Emitter(program, options)
    body = emitter.function_body()
    header = _header(program, stem)
    # only a kernel with a parallel loop carries the thread pool (it costs compile time);
    # it comes first, for its #define _GNU_SOURCE
    prelude = THREAD_POOL + PRELUDE if emitter.parallel else PRELUDE
    panel_products = [s for s in statements(program.body) if isinstance(s, PanelGemm)]
    if any(s.k_group == 1 for s in panel_products):
        prelude += PANEL_PRELUDE
    if any(s.k_group > 1 for s in panel_products):
        prelude += INT8_PANEL_PRELUDE
    if any(isinstance(s, (TapGemm, Winograd)) for s in statements(program.body)):
        prelude += TAP_PRELUDE
    if any(isinstance(s, Winograd) for s in statements(program.body)):
        prelude += WINOGRAD_PRELUDE
    if any(isinstance(s, (Transpose, LaneTaps)) for s in statements(program.body)):
        prelude += TRANSPOSE_PRELUDE
    if any(isinstance(s, PlaneTaps) for s in statements(program.body)):
        prelude += PLANE_TAPS_PRELUDE
    if any(isinstance(s, StridedGemm) and s.a_blocks for s in statements(program.body)):
        prelude += ROW_BLOCKS_PRELUDE
    if program.index_sites:
        prelude += INDEX_PRELUDE
    digest = hashlib.sha256("\n".join([stem, header, prelude, *body]).encode()).hexdigest()[:10]
    symbol = f"{stem}_{digest}"
    text = "\n".join([header, prelude, f"void {symbol}(void **args)", "{", *body, "}", ""])
    return CSource(text, symbol, param_specs(program), CpuLaunch(program.threads, tuple(program.grid)))


def _header(p: TileProgram, stem: str) -> str:
    lines = [f"tilefuse cpu kernel: {stem}", *p.notes]
    for k, b in enumerate(p.params):
        role = "in " if k < p.num_inputs else "out"
        lines.append(f"{role} args[{k}] {b.name}: {b.dtype}{list(b.shape)}")
    if p.index_sites:
        lines.append(f"status args[{len(p.params)}] {STATUS.name}: {STATUS.dtype}{list(STATUS.shape)} "
                     f"({p.index_sites} index checks)")
    lines.append("ABI: void SYMBOL(void **args); args[i] = base of param i, dense row-major; params never overlap")
    return "/* " + "\n * ".join(x.replace("*/", "* /") for x in lines) + "\n */"


class _Emitter:
    def __init__(self, program: TileProgram, options: CpuOptions) -> None:
        # accesses whose per-dim indices cancel to a run, printed at their flat offset
        self.p, self.options = flatten_accesses(program), options
        self.table = ExprTable()
        self.names = Names()
        self.grid_parallel = math.prod(program.grid) > 1
        self.ranges: dict[str, tuple[int, int]] = {
            cident(v.name): (0, g - 1) for v, g in zip(program.block_vars, program.grid)
        }
        self._writes: dict[int, tuple[Loop, frozenset[str]]] = {}
        # products that start their tile at zero instead of a zeroing pass (first_products.py)
        self.starts = first_products.plan(self.p)
        # products whose epilogue runs block by block, and whose tile is never allocated
        limits = block_epilogues.Limits(options.block_epilogue_rows, options.block_epilogue_b_bytes)
        self.fusions = block_epilogues.plan(self.p, self.starts, limits)
        self.unallocated = {f.c.name for f in self.fusions.values()}
        self.blocks: dict[str, tuple[str, str]] = {}  # loop variable -> C start, stop of the block it runs over
        self.parallel = False  # whether an ``omp parallel`` loop was emitted
        self.tables = 0  # TapGemm offset tables printed so far (each its own name)

    # -- the function ------------------------------------------------------------------
    def function_body(self) -> list[str]:
        out = []
        for k, b in enumerate(self.p.params):
            const = "const " if k < self.p.num_inputs else ""
            t = storage(b.dtype)
            out.append(f"    {const}{t} *restrict {cident(b.name)} = ({const}{t} *)args[{k}];")
        if self.p.index_sites:
            out.append(f"    int64_t *restrict {cident(STATUS.name)} = (int64_t *)args[{len(self.p.params)}];")
        tile = self._allocs() + self.block(self.p.body, [], in_parallel=self.grid_parallel)
        tile += [f"free({cident(b.name)});" for b in self._heap]
        if self.grid_parallel:
            axes = self.p.host_order or tuple(range(len(self.p.grid)))
            loops = [f"for (int64_t {cident(v.name)} = 0; {cident(v.name)} < {g}; ++{cident(v.name)}) {{"
                     for v, g in ((self.p.block_vars[d], self.p.grid[d]) for d in axes)]
            collapse = f" collapse({len(loops)})" if len(loops) > 1 else ""
            if math.prod(self.p.grid) * sum(_work(s) for s in self.p.body) >= self.options.parallel_min_work:
                out.append(f"    #pragma omp parallel for{collapse} schedule(static)")
                self.parallel = True
            out += [f"    {x}" for x in loops] + [f"        {x}" for x in tile] + ["    " + "}" * len(loops)]
        else:
            out += [f"    const int64_t {cident(v.name)} = 0; (void){cident(v.name)};" for v in self.p.block_vars]
            out += [f"    {x}" for x in tile]
        return out

    def _allocs(self) -> list[str]:
        lines, on_stack = [], 0
        self._heap: list[Buffer] = []
        for b in self.p.allocs:
            if b.name in self.unallocated:
                continue
            n = max(math.prod(b.shape), 1)
            nbytes, name, t = n * b.dtype.itemsize, cident(b.name), storage(b.dtype)
            if nbytes <= self.options.stack_buffer_bytes and on_stack + nbytes <= self.options.stack_total_bytes:
                on_stack += nbytes
                zeroed = "" if b.name in self.starts.raw else " = {0}"
                lines.append(f"{t} {name}[{n}] __attribute__((aligned(64))){zeroed};")
            else:
                self._heap.append(b)
                alloc = "tf_alloc_raw" if b.name in self.starts.raw else "tf_alloc"
                lines.append(f"{t} *restrict {name} = ({t} *){alloc}({nbytes});")
        return lines

    # -- statements --------------------------------------------------------------------
    def block(self, body: Sequence[Stmt], levels: list[LoopLevel], in_parallel: bool) -> list[str]:
        out: list[str] = []
        fused = None
        for s in body:
            if fused is not None and s is fused.rows:
                fused = None  # printed with its product
                continue
            fused = self.fusions.get(id(s))
            out += self.stmt(s, levels, in_parallel) if fused is None else self.block_epilogue(fused, levels)
        return out

    def block_epilogue(self, f: block_epilogues.Fusion, levels: list[LoopLevel]) -> list[str]:
        """A product and its epilogue in register blocks (``block_epilogues.py``): each
        block's product over every K step into a block buffer, then the epilogue's rows
        and columns of that block, reading the buffer where it read the tile."""
        s, c = f.product, f.c
        (m, n), width = c.shape, block_epilogues.BLOCK_COLUMNS
        buf, j0, i0 = (self.names.temp(x) for x in ("_cb", "_j", "_i"))
        view = Buffer(self.names.temp(f"{c.name}_block"), c.dtype, (m, width), c.scope)
        inner = list(levels)
        kt = f.k_loop
        if kt is not None:
            inner.append(LoopLevel(cident(kt.var.name), kt.extent, frozenset({buf})))
            self.ranges[cident(kt.var.name)] = (0, kt.extent - 1)
        se = self.exprs(inner, (*s.a.offsets, *s.b.offsets))
        a, lda, b, ldb = emit_tiles.strided_operands(s, se)
        zero = "1" if kt is None else f"{cident(kt.var.name)} == 0"
        rows = replace(f.rows, body=(replace(f.columns, body=tuple(
            replace(x, value=block_epilogues.block_view(x.value, c, view),
                    indices=tuple(block_epilogues.block_view(e, c, view) for e in x.indices))
            for x in f.columns.body if isinstance(x, Store))),))

        def product(height: str, span: str) -> list[str]:
            return se.lines + [emit_tiles.strided_call(s, se, height, span, f"{a} + {i0} * {lda}", lda, f"{b} + {j0}", ldb,
                                                       buf, width, zero)]
        k_pre: list[str] = []
        if kt is not None:
            k_pre = list(inner[-1].pre)
            self.ranges.pop(cident(kt.var.name), None)

        def block(height: str, span: str) -> list[str]:
            """A block of ``height`` rows and ``span`` columns: its product, then its epilogue."""
            lines = product(height, span)
            if kt is not None:
                var = cident(kt.var.name)
                lines = k_pre + [f"for (int64_t {var} = 0; {var} < {kt.extent}; ++{var}) {{", *["    " + x for x in lines], "}"]
            self.blocks = {cident(f.rows.var.name): (i0, f"{i0} + {height}"),
                           cident(f.columns.var.name): (j0, f"{j0} + {span}")}
            try:  # (the bounds analysis keeps the loops' whole ranges, which hold the block)
                epilogue = self.nest([rows], levels, "")
            finally:
                self.blocks = {}
            return [*lines, view_at, *epilogue]

        view_at = (f"float *{cident(view.name)} = (float *)((uintptr_t){buf} - "
                   f"(uintptr_t)({i0} * {width} + {j0}) * sizeof(float));")

        def over(var: str, start: int, count: int, step: int, body: list[str]) -> list[str]:
            """``body`` for ``var`` = start, start + step, ... (``count`` of them)."""
            if count == 1:
                return ["{", f"    const int64_t {var} = {start};", *["    " + x for x in body], "}"]
            return [f"for (int64_t {var} = {start}; {var} < {start + count * step}; {var} += {step}) {{",
                    *["    " + x for x in body], "}"]

        # every block with its sizes as constants (the tile's are): the product is one call
        # of the core's register block, the epilogue's loops have fixed trip counts
        # (a weight in row blocks is packed in AVX-512's, which only its kernels read)
        avx512 = bool(s.a_blocks) or cpu_isa.has(self.options.isa, "avx512f")
        runs = block_epilogues.row_runs(m, avx512)  # (first row, blocks, rows each)
        spans = [(0, n // width, width)] if n >= width else []
        if n % width:
            spans.append((n - n % width, 1, n % width))
        if f.rows_outer:  # a row of blocks at a time (block_epilogues.py)
            loops = [x for first, count, height in runs for x in over(i0, first, count, height, [
                y for j, cols, span in spans for y in over(j0, j, cols, width, block(str(height), str(span)))])]
        else:
            loops = [x for j, cols, span in spans for x in over(j0, j, cols, width, [
                y for first, count, height in runs for y in over(i0, first, count, height, block(str(height), str(span)))])]
        return ["{", f"    float {buf}[{block_epilogues.BLOCK_ROWS * width}] __attribute__((aligned(64)));",
                *["    " + x for x in loops], "}"]

    def stmt(self, s: Stmt, levels: list[LoopLevel], in_parallel: bool) -> list[str]:
        if isinstance(s, Loop):
            return self.loop(s, levels, in_parallel)
        if isinstance(s, Store):
            return self.store(s, levels)
        if isinstance(s, Fill):
            return [] if id(s) in self.starts.dropped else emit_tiles.fill(s)
        if isinstance(s, Copy):
            return emit_tiles.copy(s, self.exprs(levels, (*s.src.offsets, *s.dst.offsets)), self.names)
        if isinstance(s, Gemm):
            parallel = not in_parallel and _work(s) >= self.options.parallel_min_work
            self.parallel |= parallel
            return emit_tiles.gemm(s, parallel=parallel, zero=self.zero(s))
        if isinstance(s, PanelGemm):
            columns = () if s.columns is None else (s.columns,)
            return emit_tiles.panel_gemm(s, self.exprs(levels, (*s.a.offsets, s.panel0, s.k0, *columns)), self.zero(s))
        if isinstance(s, StridedGemm):
            return emit_tiles.strided_gemm(s, self.exprs(levels, (*s.a.offsets, *s.b.offsets)), self.zero(s))
        if isinstance(s, TapGemm):
            self.tables += 1
            return emit_tiles.tap_gemm(s, self.exprs(levels, s.a.offsets), f"tf_taps{self.tables}", self.zero(s))
        if isinstance(s, Transpose):
            return emit_tiles.transpose(s, self.exprs(levels, (*s.src.offsets, *s.dst.offsets)))
        if isinstance(s, LaneTaps):
            self.tables += 1
            return emit_tiles.lane_taps(s, f"tf_taps{self.tables}")
        if isinstance(s, Winograd):
            return emit_tiles.winograd(s, self.exprs(levels, (s.image, s.row0, s.k0)))
        if isinstance(s, PlaneTaps):
            return emit_tiles.plane_taps(s, self.exprs(levels, (s.image, s.channel0, s.row0)))
        if isinstance(s, ReduceTile):
            return emit_tiles.reduce(s)
        if isinstance(s, If):
            return self.branch(s, levels, in_parallel)
        raise TypeError(f"{self.p.name}: unknown statement {s!r}")

    def zero(self, s: Stmt) -> str:
        """The product core's ``zero`` flag for product ``s``: C for whether it starts its
        tile at zero (``first_products.plan``)."""
        if id(s) not in self.starts.products:
            return "0"
        var = self.starts.products[id(s)]
        return "1" if var is None else f"{cident(var.name)} == 0"

    def branch(self, s: If, levels: list[LoopLevel], in_parallel: bool) -> list[str]:
        """``if (cond) { body }``. Nothing inside is hoisted above the branch (a load the
        condition guards must not run where it is false): the enclosing loops are not
        movable from inside it."""
        se = self.exprs(levels, (s.cond,))
        fixed = [replace(lv, movable=False) for lv in levels]
        body = self.block(s.body, fixed, in_parallel)
        return se.lines + [f"if ({se.root(0)}) {{", *["    " + x for x in body], "}"]

    def exprs(self, levels: list[LoopLevel], roots: Sequence[Expr]) -> StmtExprs:
        ids = [self.table.intern(e) for e in roots]
        return StmtExprs(self.table, self.names, levels, self.ranges, ids, lambda b: cident(b.name))

    def store(self, s: Store, levels: list[LoopLevel]) -> list[str]:
        se = self.exprs(levels, (*s.indices, s.value))
        idx = [se.root(k) for k in range(len(s.indices))]
        value = se.root(len(s.indices))
        vtype = self.table.nodes[se.roots[-1]].dtype
        text = store_as(value, vtype, s.buffer.dtype)
        return se.lines + [f"{cident(s.buffer.name)}[{flat_index(idx, s.buffer.shape)}] = {text};"]

    def loop(self, s: Loop, levels: list[LoopLevel], in_parallel: bool) -> list[str]:
        if s.kind is LoopKind.SERIAL and s.extent > 0:
            local = frozenset(b.name for b in self.p.allocs)
            running = accumulate.running_reduction(s, local, self.names.temp("acc"))
            if running is not None:  # the running value in a register (accumulate.py)
                acc, stmts = running
                decl = f"{storage(acc.dtype)} {cident(acc.name)}[1];"
                saved = [lv.writes for lv in levels]
                for lv in levels:  # acc lives in the braces: never hoist a read of it out
                    lv.writes = lv.writes | {cident(acc.name)}
                try:
                    lines = self.block(stmts, levels, in_parallel)
                finally:
                    for lv, w in zip(levels, saved):
                        lv.writes = w
                return ["{", "    " + decl, *["    " + x for x in lines], "}"]
        nest = [s]
        while len(nest[-1].body) == 1 and isinstance(nest[-1].body[0], Loop) and nest[-1].body[0].kind is LoopKind.PARALLEL:
            nest.append(nest[-1].body[0])
        if any(l.extent <= 0 for l in nest):
            return []  # never runs: nothing may be hoisted out of it either
        if s.kind is LoopKind.PARALLEL and not in_parallel and _work(s) >= self.options.parallel_min_work:
            keep_simd = len(nest) > 1 and _simd_ok(nest[-1]) and math.prod(l.extent for l in nest[:-1]) >= self.options.collapse_min_iters
            k = len(nest) - 1 if keep_simd else len(nest)
            simd = " simd" if k == 1 and len(nest) == 1 and _simd_ok(s) else ""
            collapse = f" collapse({k})" if k > 1 else ""
            self.parallel = True
            return self.nest(nest[:k], levels, f"#pragma omp parallel for{simd}{collapse} schedule(static)")
        pragma = "#pragma omp simd" if s.kind is LoopKind.PARALLEL and _simd_ok(s) else ""
        # (a loop a block epilogue already runs over a block of is left as it is)
        cut = self._clamp_cut(s, levels) if pragma and cident(s.var.name) not in self.blocks else None
        if cut is not None:  # below the cut no index clamps: two loops (``_clamp_cut``)
            name = cident(s.var.name)
            out: list[str] = []
            for start, stop in ((0, cut), (cut, s.extent)):
                self.blocks[name] = (str(start), str(stop))
                try:
                    out += self.nest([s], levels, pragma, in_parallel=in_parallel)
                finally:
                    self.blocks.pop(name, None)
            return out
        step = self.options.overlap_tail
        # (only where the compiler's own tail, vectors of a half and a quarter of a step, would
        # leave elements to scalar code: 196 = 12 x 16 + 4 took 1.16x as long overlapped)
        if (pragma and step and s.extent > step and s.extent % step % max(step // 4, 1) and _rereads_nothing(s)
                and _costly(s)):
            return self.nest([s], levels, pragma, in_parallel=in_parallel, overlap=step)
        return self.nest([s], levels, pragma, in_parallel=in_parallel)

    def _clamp_cut(self, s: Loop, levels: list[LoopLevel]) -> int | None:
        """Where an element loop's indices stop needing a clamp: the first iteration at
        which ``min(i + a, c)`` (``i`` the loop's variable, ``a`` of one known value, ``c``
        a constant: a tile's last lanes reading the last real element again) clamps, when
        it lies inside the loop, else None. Printed as two loops split there, the first one's
        range makes the clamp vanish (``StmtExprs.simplify``): runs GCC vectorises, where
        the clamped index left it one element at a time (ViT's 197 keys in tiles of 208)."""
        cuts = []
        for x in s.body:
            assert isinstance(x, Store)
            for e in (x.value, *x.indices):
                for m in subexpressions(e):
                    if not (isinstance(m, IndexOp) and m.op is IOp.MIN and isinstance(m.b, Const)):
                        continue
                    offset = self._offset_from(m.a, s.var, levels)
                    if offset is not None and 0 < int(m.b.value) - offset + 1 < s.extent:
                        cuts.append(int(m.b.value) - offset + 1)
        return min(cuts) if cuts else None

    def _offset_from(self, e: Expr, var: Var, levels: list[LoopLevel]) -> int | None:
        """``a`` where ``e`` is ``var + a`` (or ``var``) and ``a`` takes one value over the
        enclosing loops' ranges (the printer's own bounds, ``StmtExprs.bounds``); else None."""
        if e == var:
            return 0
        if not (isinstance(e, IndexOp) and e.op is IOp.ADD):
            return None
        other = e.b if e.a == var else e.a if e.b == var else None
        if other is None:
            return None
        se = self.exprs(levels, (other,))
        lo_hi = se.bounds(se.roots[0])
        return lo_hi[0] if lo_hi is not None and lo_hi[0] == lo_hi[1] else None

    def nest(self, loops: list[Loop], levels: list[LoopLevel], pragma: str, in_parallel: bool = True,
             overlap: int = 0) -> list[str]:
        """``loops`` perfectly nested under one pragma; the innermost one's body inside.
        A loop of ``self.blocks`` runs over that block of its range only. With ``overlap``
        (one loop, not blocked), the loop runs in steps of that many, the pragma on each
        step's loop, the last step moved back to end at the loop's end."""
        inner = levels + [
            LoopLevel(cident(l.var.name), l.extent, self.writes(l), movable=(k == 0)) for k, l in enumerate(loops)
        ]
        saved = {lv.var: self.ranges.get(lv.var) for lv in inner[len(levels):]}
        for lv in inner[len(levels):]:
            start, stop = self.blocks.get(lv.var, ("0", str(lv.extent)))
            known = start.isdigit() and stop.isdigit()  # a block of constant bounds: its own range
            self.ranges[lv.var] = (int(start), int(stop) - 1) if known else (0, lv.extent - 1)
        body = self.block(loops[-1].body, inner, in_parallel)
        for var, r in saved.items():
            if r is None:
                self.ranges.pop(var, None)
            else:
                self.ranges[var] = r
        mine = inner[len(levels):]
        assert all(not lv.pre for lv in mine[1:]), "nothing is hoisted between collapsed loops"
        out = list(mine[0].pre)
        if overlap and len(mine) == 1 and mine[0].var not in self.blocks:
            v, n = mine[0].var, mine[0].extent
            return out + [f"for (int64_t {v}_o = 0; {v}_o < {n}; {v}_o += {overlap}) {{",
                          f"    const int64_t {v}_b = {v}_o < {n - overlap} ? {v}_o : {n - overlap};",
                          f"    {pragma}",
                          f"    for (int64_t {v}_l = 0; {v}_l < {overlap}; ++{v}_l) {{",
                          f"        const int64_t {v} = {v}_b + {v}_l;",
                          *["        " + x for x in body], "    }", "}"]
        out += [pragma] if pragma else []
        for d, lv in enumerate(mine):
            start, stop = self.blocks.get(lv.var, ("0", str(lv.extent)))
            out.append("    " * d + f"for (int64_t {lv.var} = {start}; {lv.var} < {stop}; ++{lv.var}) {{")
        out += ["    " * len(mine) + x for x in body]
        out += ["    " * d + "}" for d in reversed(range(len(mine)))]
        return out

    def writes(self, loop: Loop) -> frozenset[str]:
        hit = self._writes.get(id(loop))
        if hit is None or hit[0] is not loop:
            names: set[str] = set()
            _collect_writes(loop.body, names)
            hit = self._writes[id(loop)] = (loop, frozenset(cident(n) for n in names))
        return hit[1]


def _collect_writes(body: Sequence[Stmt], out: set[str]) -> None:
    for s in body:
        if isinstance(s, (Loop, If)):
            _collect_writes(s.body, out)
        elif isinstance(s, (Store, Fill)):
            out.add(s.buffer.name)
        elif isinstance(s, Copy):
            out.add(s.dst.buffer.name)
        elif isinstance(s, Transpose):
            out.add(s.dst.buffer.name)
        elif isinstance(s, (LaneTaps, PlaneTaps)):
            out.add(s.out.name)
        elif isinstance(s, Winograd):
            out.update((s.v.name, s.m.name, s.c.name))
        elif isinstance(s, (Gemm, PanelGemm, StridedGemm, TapGemm)):
            out.add(s.c.name)
        elif isinstance(s, ReduceTile):
            out.add(s.dst.name)


def _simd_ok(loop: Loop) -> bool:
    """``omp simd`` is safe on a parallel loop (independent iterations by contract) whose
    body is plain stores: no nested loops or tile statements to vectorise around."""
    return loop.kind is LoopKind.PARALLEL and all(isinstance(s, Store) for s in loop.body)


def _rereads_nothing(loop: Loop) -> bool:
    """Whether ``loop``'s body (stores only) reads none of the buffers it stores to, so that
    running an iteration twice stores the same values: what an overlapped last step does.
    (Distinct buffers never share memory: a plan's steps never write in place,
    plan/memory.py.)"""
    stored = {s.buffer for s in loop.body if isinstance(s, Store)}
    return not any(stmt_reads(s, b) for s in loop.body for b in stored)


# element functions whose scalar form costs tens of operations (a polynomial, a division)
_COSTLY = frozenset({ScalarFn.EXP, ScalarFn.LOG, ScalarFn.ERF, ScalarFn.TANH, ScalarFn.SIGMOID, ScalarFn.SIN, ScalarFn.COS,
                     ScalarFn.TAN, ScalarFn.ASIN, ScalarFn.ACOS, ScalarFn.ATAN, ScalarFn.SINH, ScalarFn.COSH, ScalarFn.ASINH,
                     ScalarFn.ACOSH, ScalarFn.ATANH, ScalarFn.POW, ScalarFn.DIV, ScalarFn.RECIPROCAL, ScalarFn.SQRT})


def _costly(loop: Loop) -> bool:
    """Whether ``loop``'s body computes an element function that is slow as a scalar: what
    makes a scalar tail cost more than an overlapped vector step (copies and cheap
    arithmetic keep the compiler's own tail: overlapped, the stride-2 copies of a depthwise
    convolution took 1.1-1.25x as long)."""
    return any(isinstance(e, Call) and e.fn in _COSTLY
               for s in loop.body if isinstance(s, Store) for x in (s.value, *s.indices) for e in subexpressions(x))


def _work(s: Stmt) -> int:
    """A rough count of element operations, to decide what is worth threads."""
    if isinstance(s, Loop):
        return s.extent * sum(_work(b) for b in s.body)
    if isinstance(s, If):
        return sum(_work(b) for b in s.body)
    if isinstance(s, Gemm):
        m, k = s.a.shape[::-1] if s.trans_a else s.a.shape
        return m * k * s.c.shape[-1]
    if isinstance(s, (PanelGemm, StridedGemm, TapGemm)):
        return math.prod(s.c.shape) * s.a.extents[-1]
    if isinstance(s, (Copy, Transpose)):
        return math.prod(s.dst.extents)
    if isinstance(s, LaneTaps):
        return s.rows * s.width * len(s.offsets) * s.out.shape[-1]
    if isinstance(s, PlaneTaps):
        return s.rows * s.width * s.kernel[0] * s.kernel[1] * s.w.shape[0]
    if isinstance(s, Winograd):
        return math.prod(s.m.shape) * s.u.shape[2]
    if isinstance(s, (Fill,)):
        return math.prod(s.buffer.shape)
    if isinstance(s, ReduceTile):
        return math.prod(s.src.shape)
    return 8  # one Store: a few loads and arithmetic
