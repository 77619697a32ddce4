"""TileProgram -> a TileLang module (Python source text).

TileLang parses the source of its kernels, so the CUDA code generator writes each
TileProgram as a small Python module holding one ``@T.prim_func``; ``lower`` imports it
and hands it to TileLang. The printer decides nothing: the device passes
(``tile_ir.passes.for_device``, run by ``lower_group``) have written every choice into the
program, and the mapping is close to one-to-one:

    grid / block_vars, threads -> ``with T.Kernel(*grid, threads=...) as (...)`` (threads
                                  fitted to split every parallel nest: passes/threads.py)
    global params              -> ``T.Tensor(shape, dtype)`` arguments, in param order, then
                                  the status word of a program with index checks
    IndexCheck                 -> ``tf_index`` (include/tilefuse_math.cuh) on the status word
    allocs                     -> ``T.alloc_fragment`` for ``registers``, else
                                  ``T.alloc_shared`` (passes/placement.py)
    Fill                       -> ``T.fill``
    bulk Copy                  -> ``T.copy(src[region], tile)`` (cp.async or TMA, overlapped
                                  by a pipelined loop: passes/copies.py), or ``T.copy(a, b)``
                                  of an accumulator into its shared mirror (passes/epilogues.py);
                                  other copies element loops
    ReduceTile                 -> ``T.reduce_*`` where ``registers``, else ``lanes`` threads per
    running folds                 row with partials in shared memory (passes/lanes.py)
    Gemm                       -> ``T.gemm`` where ``tensor_cores``, else exact FMA loops
    staged epilogue nests      -> a shared tile of the output type and ``T.copy`` of its
                                  pieces (``Loop.staging``: passes/epilogues.py)
    row programs of warps      -> whole warps per row: registers and shuffles (``row_lanes``:
                                  passes/rows.py, printed by warp_rows.py)
    tma, residency             -> ``PASS_CONFIG`` and the launch bounds (passes/pipelines.py)
    loops                      -> ``T.Parallel`` (directly nested parallel loops merge into
                                  one), ``T.serial``, ``T.Pipelined(num_stages=...)``

More than three grid dimensions fold into the first CUDA one. Expressions are printed by
exprs.py (int32 index arithmetic: ``emit_tilelang`` checks tensors stay below 2^31
elements; ``let`` bindings of shared subexpressions).

Emission is pure: no tilelang import, so the text (and the cache key made from it) can be
produced anywhere.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from tilefuse.codegen.artifact import ParamSpec
from tilefuse.codegen.cuda.exprs import ExprPrinter, dtype_text, shape_text
from tilefuse.codegen.cuda.warp_rows import warp_rows
from tilefuse.codegen.options import CudaOptions
from tilefuse.codegen.toolchain import kernel_stem, param_specs
from tilefuse.device import HOPPER, Device
from tilefuse.errors import CompileError
from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ReduceFn, ScalarFn
from tilefuse.tile_ir.ir import (Buffer, Copy, Expr, Fill, Gemm, If, Loop, LoopKind, ReduceTile, Scope, STATUS, Staging, Stmt,
                                 Store, TileProgram)
from tilefuse.tile_ir.nests import accumulation, parallel_nest, stmt_reads, uneven_nests
from tilefuse.tile_ir.passes.lanes import lane_fold

MAX_ELEMENTS = 2**31 - 1  # int32 indexing


@dataclass(frozen=True)
class TileLangSource:
    """One emitted kernel module: its text, the prim_func's name (TileLang names the CUDA
    entry ``<func>_kernel``), the kernel's params in TileProgram order (then its status
    word) and whether it calls ``tf_index`` (include/tilefuse_index.cuh)."""

    text: str
    func: str
    params: tuple[ParamSpec, ...]
    checks_indices: bool = False

    @property
    def entry(self) -> str:
        return f"{self.func}_kernel"


def emit_tilelang(program: TileProgram, options: CudaOptions = CudaOptions(), device: Device = HOPPER) -> TileLangSource:
    for b in program.params:
        if math.prod(b.shape) > MAX_ELEMENTS:
            raise CompileError(f"kernel {program.name}: param {b.name} has {math.prod(b.shape)} elements (> 2^31)")
    emitter = _Emitter(program, options, device)
    body = emitter.kernel()
    emitter.header.insert(0, f"PASS_CONFIG = {emitter.pass_config()!r}")
    stem = kernel_stem(program.name)
    args = ", ".join(f"{emitter.name(b)}: T.Tensor({shape_text(b.shape)}, {dtype_text(b.dtype)})"
                     for b in program.params + ((STATUS,) if program.index_sites else ()))
    # the signature too: two bodies can be equal over params of different shapes (a slice
    # of the first row of [9, 2, 32] or of [1, 2, 32]), and a name is one kernel
    digest = hashlib.sha256("\n".join([stem, args, *emitter.header, *body]).encode()).hexdigest()[:10]
    func = f"{stem}_{digest}"
    lines = [
        f'"""tilefuse cuda kernel {func} (TileProgram {program.name}); generated, do not edit.',
        *(f"{n}" for n in program.notes),
        '"""',
        "import tilelang.language as T",
        "",
        *emitter.header,
        "",
        "",
        "@T.prim_func",
        f"def {func}({args}):",
        *body,
        "",
    ]
    return TileLangSource("\n".join(lines), func, param_specs(program), program.index_sites > 0)


_REDUCE = {ReduceFn.SUM: "T.reduce_sum", ReduceFn.MAX: "T.reduce_max", ReduceFn.MIN: "T.reduce_min"}


class _Emitter(ExprPrinter):
    def __init__(self, program: TileProgram, options: CudaOptions, device: Device) -> None:
        super().__init__(program, options)
        self.device = device
        self.locals: dict[DType, str] = {}  # per-thread accumulators, one per dtype
        self.partials: list[str] = []  # shared buffers of cooperative reductions, allocated last
        self.staging: list[str] = []  # shared output tiles of staged stores, allocated last

    def pass_config(self) -> dict[str, bool]:
        """TileLang pass options for this kernel (the lowering reads ``PASS_CONFIG`` from
        the module): TMA loads and warp specialisation where the program says so
        (tile_ir.passes.plan_pipelines), else cp.async under TileLang's software pipeline."""
        return {} if self.p.tma else {"tl.disable_tma_lower": True, "tl.disable_warp_specialized": True}

    # -- the kernel --------------------------------------------------------------------
    def kernel(self) -> list[str]:
        p = self.p
        uneven = uneven_nests(p.body, p.threads)
        if p.threads > self.device.max_block_threads or uneven:  # what tile_ir.passes.for_device and the verifier ensure
            raise CompileError(f"kernel {p.name}: {p.threads} threads per block do not fit the device or split its "
                               f"parallel nests {uneven} evenly (run tile_ir.passes.for_device before printing)")
        grid, bvars = list(p.grid), [self.name(v) for v in p.block_vars]
        threads = p.threads
        lines: list[str] = []
        if len(grid) <= 3:
            names = ", ".join(bvars)
            target = f"({names})" if len(bvars) > 1 else names
            lines.append(f"    with T.Kernel({', '.join(map(str, grid))}, threads={threads}) as {target}:")
            unfold: list[str] = []
        else:  # fold the leading dims into blockIdx.x
            lead = math.prod(grid[:-2])
            lines.append(f"    with T.Kernel({lead}, {grid[-2]}, {grid[-1]}, threads={threads}) as (_bx, {bvars[-2]}, {bvars[-1]}):")
            unfold, stride = [], lead
            for v, g in zip(bvars[:-2], grid[:-2]):
                stride //= g
                unfold.append(f"{v} = (_bx // {stride}) % {g}")
        ind = " " * 8
        lines += [ind + x for x in unfold]
        if self.options.programmatic_launch is not None:
            pdl = [f"{ind}T.pdl_trigger()", f"{ind}T.pdl_sync()"]
            lines += pdl if self.options.programmatic_launch == "release-first" else pdl[::-1]
        r = p.residency  # (tile_ir.passes.plan_pipelines)
        bound = [f"T.annotate_min_blocks_per_sm({r.blocks})"] if r.blocks > 1 else []
        if r.consumer_registers:
            bound += [f"T.annotate_producer_reg_dealloc({r.producer_registers})",
                      f"T.annotate_consumer_reg_alloc({r.consumer_registers})"]
        lines += [ind + x for x in bound]
        rows = warp_rows(self, 2)  # norms and softmax rows: whole warps per row (tile_ir.passes.warp_rows)
        if rows is not None:
            return lines + rows
        register = p.registers  # (tile_ir.passes.place_registers)
        # accumulators' shared mirrors are allocs and copies of the program (tile_ir.passes.stage_epilogues)
        for b in p.allocs:
            alloc = "T.alloc_fragment" if b.scope is Scope.FRAGMENT and b.name in register else "T.alloc_shared"
            lines.append(f"{ind}{self.name(b)} = {alloc}({shape_text(b.shape)}, {dtype_text(b.dtype)})")
        body = self.block(p.body, 2) if p.body else []
        lines += [f"{ind}{name} = T.alloc_local((1,), {dtype_text(dt)})" for dt, name in self.locals.items()]
        lines += [ind + x for x in self.partials + self.staging]
        return lines + body

    def block(self, stmts: tuple[Stmt, ...], depth: int) -> list[str]:
        out: list[str] = []
        for s in stmts:
            out += self.stmt(s, depth)
        return out or [" " * 4 * depth + "T.evaluate(0)"]

    def stmt(self, s: Stmt, depth: int) -> list[str]:
        ind = " " * 4 * depth
        if isinstance(s, Loop):
            return self.loop(s, depth)
        if isinstance(s, Store):
            lets, (value, *idx) = self.render([s.value, *s.indices], [False] + [True] * len(s.indices))
            return [ind + x for x in lets] + [f"{ind}{self.name(s.buffer)}[{', '.join(idx)}] = {value}"]
        if isinstance(s, Fill):
            return [f"{ind}T.fill({self.name(s.buffer)}, {self.const(s.value.value, s.buffer.dtype)})"]
        if isinstance(s, Copy) and s.bulk:  # a whole tile loaded from global memory (tile_ir.passes.raise_copies)
            return [ind + self.bulk_copy(s)]
        if isinstance(s, Copy):  # an accumulator tile written out (the staged schedule)
            return self.copy_loop(s, depth)
        if isinstance(s, Gemm):
            return self.gemm(s, depth)
        if isinstance(s, If):  # a tile-uniform branch (a packed sibling's own epilogue)
            return self.branch(s, depth)
        if isinstance(s, ReduceTile):
            fn = _REDUCE.get(s.fn)
            if fn is not None and s.registers:  # (tile_ir.passes.place_registers)
                return [f"{ind}{fn}({self.name(s.src)}, {self.name(s.dst)}, dim={s.dim}, clear={s.clear})"]
            return self.reduce_loops(s, depth)
        raise CompileError(f"kernel {self.p.name}: no TileLang form for {type(s).__name__}")

    def branch(self, s: If, depth: int) -> list[str]:
        ind = " " * 4 * depth
        lets, (cond,) = self.render([s.cond], [True])
        return [ind + x for x in lets] + [f"{ind}if {cond}:"] + self.block(s.body, depth + 1)

    def loop(self, s: Loop, depth: int) -> list[str]:
        ind = " " * 4 * depth
        if s.kind is LoopKind.PARALLEL:
            loops = parallel_nest(s)
            head = f"for {', '.join(self.name(l.var) for l in loops)} in T.Parallel({', '.join(str(l.extent) for l in loops)}):"
            if s.staging is not None:  # (tile_ir.passes.stage_epilogues)
                return self.staged_store(loops, s.staging, depth)
            acc = accumulation(loops[-1].body)
            if acc is not None:
                init, inner, update, after = acc
                if inner.lanes > 1:  # (tile_ir.passes.assign_lanes)
                    return self.accumulate_lanes(loops, depth)
                # a window's running value, read only by its own epilogue, never needs its tile
                keep = not after or _read_outside(self.p.body, init.buffer, s)
                return [ind + head] + self.accumulate(init, inner, update, after, depth + 1, keep)
            return [ind + head] + self.block(loops[-1].body, depth + 1)
        if s.kind is LoopKind.PIPELINED and s.stages > 1:
            head = f"for {self.name(s.var)} in T.Pipelined({s.extent}, num_stages={s.stages}):"
        else:
            head = f"for {self.name(s.var)} in T.serial({s.extent}):"
        return [ind + head] + self.block(s.body, depth + 1)

    def local(self, dtype: DType) -> str:
        if dtype not in self.locals:
            self.locals[dtype] = f"_acc_{dtype.value}"
        return self.locals[dtype]

    def accumulate(self, init: Store, inner: Loop, update: Store, after: tuple[Store, ...], depth: int,
                   keep: bool = True) -> list[str]:
        """``b[i] = init; for j...: b[i] = f(b[i], ...)`` inside a parallel loop, accumulated
        in a per-thread register: shared memory is written once, after the loops (a barrier
        inside a branch that not every thread takes cannot be placed), and not at all
        unless ``keep``. The stores ``after`` read b[i] from the register too."""
        ind = " " * 4 * depth
        acc = f"{self.local(init.buffer.dtype)}[0]"
        lets, (value,) = self.render([init.value], [False])
        out = [ind + x for x in lets] + [f"{ind}{acc} = {value}"]
        key = (init.buffer.name, init.indices)
        self.replaced[key] = acc
        loop, deep = inner, ind
        while True:
            out.append(f"{deep}for {self.name(loop.var)} in T.serial({loop.extent}):")
            deep += "    "
            if not isinstance(loop.body[0], Loop):
                break
            loop = loop.body[0]
        lets, (value,) = self.render([update.value], [False])
        out += [deep + x for x in lets] + [f"{deep}{acc} = {value}"]
        for s in after:
            out += self.stmt(s, depth)
        del self.replaced[key]
        if not keep:
            return out
        lets, idx = self.render(list(init.indices), [True] * len(init.indices))
        return out + [ind + x for x in lets] + [f"{ind}{self.name(init.buffer)}[{', '.join(idx)}] = {acc}"]

    def bulk_copy(self, s: Copy) -> str:
        """``T.copy(src[region], tile)``: TileLang turns it into vectorised asynchronous
        copies that a pipelined K loop overlaps with the products. The source's leading
        dims beyond the tile's rank are fixed indices, the rest ``offset:offset + extent``.
        A whole on-chip tile (an accumulator into its mirror) is ``T.copy(tile, tile)``."""
        if s.src.buffer.scope is not Scope.GLOBAL:
            return f"T.copy({self.name(s.src.buffer)}, {self.name(s.dst.buffer)})"
        fixed = len(s.src.extents) - len(s.dst.buffer.shape)
        parts = []
        for d, (o, ext) in enumerate(zip(s.src.offsets, s.src.extents)):
            t = self.index(o)
            parts.append(t if d < fixed else (f"{t}:{t} + {ext}" if t != "0" else f"0:{ext}"))
        return f"T.copy({self.name(s.src.buffer)}[{', '.join(parts)}], {self.name(s.dst.buffer)})"

    def region(self, rect: tuple[tuple[Expr, int | None], ...]) -> list[str]:
        """The slice texts of a rectangle (tile_ir.nests.rectangle): fixed indices, then
        ``offset:offset + extent``."""
        parts = []
        for o, ext in rect:
            t = self.index(o)
            parts.append(t if ext is None else (f"{t}:{t} + {ext}" if t != "0" else f"0:{ext}"))
        return parts

    def staged_store(self, loops: list[Loop], staging: Staging, depth: int) -> list[str]:
        """An epilogue nest ``out[...] = f(acc[i, j], ...)`` the program stages: each thread
        computes its own elements into a shared tile of the output's type, and ``T.copy``
        writes each piece out with whole-line vector stores (a thread's accumulator elements
        are scattered over the tile's rows). A transposed nest runs in the accumulator's
        order (each thread its own registers) into a [col, row] tile, copied out along its
        rows."""
        st = loops[-1].body[0]
        if len(loops) != 2 or not isinstance(st, Store):  # what the verifier ensures
            raise CompileError(f"kernel {self.p.name}: a staged nest is no nest of two loops and one store")
        ind = " " * 4 * depth
        where = [self.region(piece.region) for piece in staging.pieces]
        tile = self.staging_tile(loops[0].extent, loops[1].extent + staging.pad, st.buffer.dtype)
        lets, (value,) = self.render([st.value], [False])
        out_name = self.name(st.buffer)
        if staging.transposed:
            cols, rows = loops
            r, c = self.name(rows.var), self.name(cols.var)
            out = ([f"{ind}for {r}, {c} in T.Parallel({rows.extent}, {cols.extent}):"]
                   + [f"{ind}    {x}" for x in lets] + [f"{ind}    {tile}[{c}, {r}] = {value}"])
            return out + [f"{ind}T.copy({tile}[{piece.first}:{piece.first + piece.width}, 0:{rows.extent}], "
                          f"{out_name}[{', '.join(at)}])" for piece, at in zip(staging.pieces, where)]
        names = [self.name(l.var) for l in loops]
        out = ([f"{ind}for {', '.join(names)} in T.Parallel({', '.join(str(l.extent) for l in loops)}):"]
               + [f"{ind}    {x}" for x in lets]
               + [f"{ind}    {tile}[{', '.join(names)}] = {value}"])
        return out + [f"{ind}T.copy({tile}[0:{loops[0].extent}, {piece.first}:{piece.first + piece.width}], "
                      f"{out_name}[{', '.join(at)}])" for piece, at in zip(staging.pieces, where)]

    def staging_tile(self, rows: int, cols: int, dtype: DType) -> str:
        """A shared tile for a staged store (its rows padded as the staging says), allocated
        after the kernel's other buffers."""
        tile = f"_out{len(self.staging)}"
        self.staging.append(f"{tile} = T.alloc_shared({shape_text((rows, cols))}, {dtype_text(dtype)})")
        return tile

    def cooperative(self, kept: list[tuple[str, int]], red: int, lanes: int, dtype: DType, combine: str,
                    identity: str, start: tuple[list[str], str], term, store: tuple[list[str], str],
                    depth: int) -> list[str]:
        """A reduction of ``red`` terms per kept index by ``lanes`` threads each: every lane
        folds the terms ``j = jj * lanes + lane`` (neighbouring lanes read neighbouring
        elements) into a register, writes its partial to shared memory, and one thread per
        kept index folds the partials after ``start``. ``term(j)`` renders the term at index
        expression ``j``; it, ``start`` and ``store`` (the target) are (let lines, text)."""
        ind = " " * 4 * depth
        part = f"_part{len(self.partials)}"
        shape = shape_text(tuple(e for _, e in kept) + (lanes,))
        self.partials.append(f"{part} = T.alloc_shared({shape}, {dtype_text(dtype)})")
        acc = f"{self.local(dtype)}[0]"
        names = [n for n, _ in kept]
        lane, jj, ll = self.temp(), self.temp(), self.temp()
        lets, value = term(f"({jj} * {lanes} + {lane})")
        extents = ", ".join(str(e) for _, e in kept)
        partial, folded = f"{part}[{', '.join(names + [lane])}]", f"{part}[{', '.join(names + [ll])}]"
        out = [f"{ind}for {', '.join(names + [lane])} in T.Parallel({extents}, {lanes}):",
               f"{ind}    {acc} = {identity}",
               f"{ind}    for {jj} in T.serial({red // lanes}):"]
        out += [f"{ind}        {x}" for x in lets]
        out += [f"{ind}        {acc} = {combine.format(a=acc, b=value)}",
                f"{ind}    {partial} = {acc}",
                f"{ind}for {', '.join(names)} in T.Parallel({extents}):"]
        out += [f"{ind}    {x}" for x in start[0]]
        out += [f"{ind}    {acc} = {start[1]}",
                f"{ind}    for {ll} in T.serial({lanes}):",
                f"{ind}        {acc} = {combine.format(a=acc, b=folded)}"]
        out += [f"{ind}    {x}" for x in store[0]]
        return out + [f"{ind}    {store[1]} = {acc}"]

    def accumulate_lanes(self, loops: list[Loop], depth: int) -> list[str]:
        """``accumulate`` with ``lanes`` threads per parallel index (the serial loop's), where
        the update is an associative fold ``b[i] = f(b[i], term)`` (sum, product, max, min)."""
        shared = lane_fold(loops)
        if shared is None:  # what the verifier ensures
            raise CompileError(f"kernel {self.p.name}: a nest's loop has lanes but is no fold's loop")
        init, inner, fn, term = shared
        combine, identity = _FOLDS[fn]
        lanes = inner.lanes
        dt = init.buffer.dtype
        lets, (start,) = self.render([init.value], [False])
        names = [(self.name(l.var), l.extent) for l in loops]
        jname = self.name(inner.var)

        def render_term(j: str) -> tuple[list[str], str]:
            tlets, (value,) = self.render([term], [False])
            return [f"{jname} = {j}"] + tlets, value

        lets_i, idx = self.render(list(init.indices), [True] * len(init.indices))
        store = (lets_i, f"{self.name(init.buffer)}[{', '.join(idx)}]")
        return self.cooperative(names, inner.extent, lanes, dt, combine, self.const(identity, dt), (lets, start),
                                render_term, store, depth)

    def copy_loop(self, s: Copy, depth: int) -> list[str]:
        """A Copy as element stores over the destination region."""
        ind = " " * 4 * depth
        ext = s.dst.extents
        vs = [self.temp() for _ in ext]
        flat = " + ".join(f"{v} * {math.prod(ext[k + 1:])}" for k, v in enumerate(vs)) or "0"
        src_idx, rest = [], flat
        for k, e in enumerate(s.src.extents):  # delinearise the flat position over the source extents
            stride = math.prod(s.src.extents[k + 1:])
            src_idx.append(f"{self.index(s.src.offsets[k])} + (({rest}) // {stride}) % {e}")
        dst_idx = [f"{self.index(o)} + {v}" for o, v in zip(s.dst.offsets, vs)]
        value = f"{self.name(s.src.buffer)}[{', '.join(src_idx)}]"
        if s.src.buffer.dtype is not s.dst.buffer.dtype:
            value = f'T.Cast("{s.dst.buffer.dtype.value}", {value})'
        return [f"{ind}for {', '.join(vs)} in T.Parallel({', '.join(map(str, ext))}):",
                f"{ind}    {self.name(s.dst.buffer)}[{', '.join(dst_idx)}] = {value}"]

    def reduce_loops(self, s: ReduceTile, depth: int) -> list[str]:
        """A tile reduction in shared memory: one thread per kept index, serial over the
        reduced one (shapes TileLang's register layouts do not cover)."""
        ind = " " * 4 * depth
        src, dst = self.name(s.src), self.name(s.dst)
        kept, red = s.src.shape[1 - s.dim], s.src.shape[s.dim]
        i, j = self.temp(), self.temp()
        at = f"{src}[{i}, {j}]" if s.dim == 1 else f"{src}[{j}, {i}]"
        dt = s.dst.dtype
        combine = {ReduceFn.SUM: "{a} + {b}", ReduceFn.PROD: "{a} * {b}", ReduceFn.MAX: "T.max({a}, {b})",
                   ReduceFn.MIN: "T.min({a}, {b})"}[s.fn]
        value = at if s.src.dtype is dt else f'T.Cast("{dt.value}", {at})'
        identity = {ReduceFn.SUM: 0, ReduceFn.PROD: 1, ReduceFn.MAX: float("-inf"), ReduceFn.MIN: float("inf")}[s.fn]
        if not dt.is_float and s.fn in (ReduceFn.MAX, ReduceFn.MIN):
            raise CompileError(f"kernel {self.p.name}: integer tile {s.fn.value} is not supported on CUDA")
        start = self.const(identity, dt) if s.clear else f"{dst}[{i}]"
        lanes = s.lanes  # (tile_ir.passes.assign_lanes)
        if lanes > 1:
            def term(jv: str) -> tuple[list[str], str]:
                at = f"{src}[{i}, {jv}]" if s.dim == 1 else f"{src}[{jv}, {i}]"
                return [], at if s.src.dtype is dt else f'T.Cast("{dt.value}", {at})'
            return self.cooperative([(i, kept)], red, lanes, dt, combine, self.const(identity, dt), ([], start), term,
                                    ([], f"{dst}[{i}]"), depth)
        acc = f"{self.local(dt)}[0]"
        return [f"{ind}for {i} in T.Parallel({kept}):",
                f"{ind}    {acc} = {start}",
                f"{ind}    for {j} in T.serial({red}):",
                f"{ind}        {acc} = {combine.format(a=acc, b=value)}",
                f"{ind}    {dst}[{i}] = {acc}"]

    def gemm(self, s: Gemm, depth: int) -> list[str]:
        ind = " " * 4 * depth
        a, b, c = (self.name(x) for x in (s.a, s.b, s.c))
        if s.tensor_cores:  # (tile_ir.passes.place_registers)
            return [f"{ind}T.gemm({a}, {b}, {c}, transpose_A={s.trans_a}, transpose_B={s.trans_b})"]
        # float32 (and anything else): exact FMA loops over the tile
        m, n = s.c.shape
        k = s.a.shape[0] if s.trans_a else s.a.shape[1]
        i, j, kk = self.temp(), self.temp(), self.temp()
        av = f"{a}[{kk}, {i}]" if s.trans_a else f"{a}[{i}, {kk}]"
        bv = f"{b}[{j}, {kk}]" if s.trans_b else f"{b}[{kk}, {j}]"
        cast = (lambda x: x) if s.a.dtype is s.c.dtype else (lambda x: f'T.Cast("{s.c.dtype.value}", {x})')
        if s.c.name in self.p.registers:
            # each thread's accumulator elements (tile_ir.passes.place_registers): the step
            # over K outermost, so one step's loads of A's rows and B's columns serve all of
            # the thread's elements (a register block); each element's sum keeps K's order
            return [
                f"{ind}for {kk} in T.serial({k}):",
                f"{ind}    for {i}, {j} in T.Parallel({m}, {n}):",
                f"{ind}        {c}[{i}, {j}] = {c}[{i}, {j}] + {cast(av)} * {cast(bv)}",
            ]
        return [
            f"{ind}for {i}, {j} in T.Parallel({m}, {n}):",
            f"{ind}    for {kk} in T.serial({k}):",
            f"{ind}        {c}[{i}, {j}] = {c}[{i}, {j}] + {cast(av)} * {cast(bv)}",
        ]


def _read_outside(stmts: tuple[Stmt, ...], buffer: Buffer, nest: Stmt) -> bool:
    """Whether a statement outside ``nest`` reads ``buffer``."""
    for s in stmts:
        if s is nest:
            continue
        if isinstance(s, (Loop, If)):
            if _read_outside(s.body, buffer, nest):
                return True
        elif stmt_reads(s, buffer):
            return True
    return False


# a fold's text and identity (tile_ir.passes.lanes.FOLDS)
_FOLDS = {ScalarFn.ADD: ("({a} + {b})", 0), ScalarFn.MUL: ("({a} * {b})", 1),
          ScalarFn.MAX: ("T.max({a}, {b})", float("-inf")), ScalarFn.MIN: ("T.min({a}, {b})", float("inf"))}
