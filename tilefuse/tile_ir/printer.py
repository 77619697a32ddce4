"""The one textual form of a TileProgram (TileLang-flavoured), for people and tests."""
from __future__ import annotations

from tilefuse.tile_ir.ir import (
    Call,
    Const,
    Copy,
    Expr,
    Fill,
    Gemm,
    If,
    IndexCheck,
    IndexOp,
    LaneTaps,
    PlaneTaps,
    Load,
    Loop,
    LoopKind,
    PanelGemm,
    ReduceTile,
    Region,
    STATUS,
    Store,
    StridedGemm,
    TapGemm,
    TileProgram,
    Transpose,
    Var,
    Winograd,
)


def format_expr(e: Expr) -> str:
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Const):
        return repr(e.value)
    if isinstance(e, IndexOp):
        if e.op.value in ("min", "max"):
            return f"{e.op.value}({format_expr(e.a)}, {format_expr(e.b)})"
        return f"({format_expr(e.a)} {e.op.value} {format_expr(e.b)})"
    if isinstance(e, Load):
        return f"{e.buffer.name}[{', '.join(map(format_expr, e.indices))}]"
    if isinstance(e, Call):
        name = f"cast<{e.dtype}>" if e.fn.name == "CAST" else e.fn.name.lower()
        return f"{name}({', '.join(map(format_expr, e.args))})"
    if isinstance(e, IndexCheck):
        return f"check_index<{e.site}>({format_expr(e.index)}, {e.extent})"
    return repr(e)


def _region(r: Region) -> str:
    return f"{r.buffer.name}[{', '.join(f'{format_expr(o)}:+{n}' for o, n in zip(r.offsets, r.extents))}]"


def _stmt(s: object, indent: int, out: list[str]) -> None:
    pad = "    " * indent
    if isinstance(s, Loop):
        kind = {LoopKind.SERIAL: "serial", LoopKind.PARALLEL: "Parallel", LoopKind.PIPELINED: f"Pipelined[{s.stages}]"}[s.kind]
        lanes = f", lanes={s.lanes}" if s.lanes != 1 else ""  # threads that share the fold (passes/lanes.py)
        staged = ""
        if s.staging is not None:  # (passes/epilogues.py)
            n = len(s.staging.pieces)
            how = " transposed" if s.staging.transposed else ""
            staged = f"  # staged{how}: {n} piece{'s' if n > 1 else ''}, rows padded by {s.staging.pad}"
        out.append(f"{pad}for {s.var.name} in T.{kind}({s.extent}{lanes}):{staged}")
        for b in s.body:
            _stmt(b, indent + 1, out)
    elif isinstance(s, If):
        out.append(f"{pad}if {format_expr(s.cond)}:")
        for b in s.body:
            _stmt(b, indent + 1, out)
    elif isinstance(s, Store):
        out.append(f"{pad}{s.buffer.name}[{', '.join(map(format_expr, s.indices))}] = {format_expr(s.value)}")
    elif isinstance(s, Fill):
        out.append(f"{pad}T.fill({s.buffer.name}, {s.value.value!r})")
    elif isinstance(s, Copy):
        out.append(f"{pad}T.copy({_region(s.src)}, {_region(s.dst)})" + ("  # bulk" if s.bulk else ""))
    elif isinstance(s, Gemm):
        out.append(f"{pad}T.gemm({s.a.name}, {s.b.name}, {s.c.name}, transpose_A={s.trans_a}, transpose_B={s.trans_b})")
    elif isinstance(s, PanelGemm):
        columns = "" if s.columns is None else f", columns={format_expr(s.columns)}"
        out.append(f"{pad}panel_gemm({_region(s.a)}, {s.b.name}[{format_expr(s.panel0)}:+{s.c.shape[1] // s.width}, "
                   f"{format_expr(s.k0)}:], {s.c.name}, k_block={s.k_block}{columns})")
    elif isinstance(s, StridedGemm):
        blocks = f", a_blocks={s.a_blocks}" if s.a_blocks else ""
        out.append(f"{pad}strided_gemm({_region(s.a)}, {_region(s.b)}, {s.c.name}, k_axis={s.k_axis}{blocks})")
    elif isinstance(s, TapGemm):
        offs = ", ".join(map(str, s.offsets)) if len(s.offsets) <= 12 else \
            ", ".join(map(str, (*s.offsets[:6], "...", *s.offsets[-3:])))
        out.append(f"{pad}tap_gemm({_region(s.a)}, {s.b.name}, {s.c.name}, offsets=[{offs}])")
    elif isinstance(s, Transpose):
        out.append(f"{pad}transpose({_region(s.src)}, {_region(s.dst)})")
    elif isinstance(s, LaneTaps):
        out.append(f"{pad}lane_taps({s.x.name}, {s.w.name}, {s.out.name}, rows={s.rows}, width={s.width}, "
                   f"steps=({s.row_step}, {s.col_step}), offsets={list(s.offsets)})")
    elif isinstance(s, PlaneTaps):
        out.append(f"{pad}plane_taps({s.x.name}[{format_expr(s.image)}, {format_expr(s.channel0)}:+{s.w.shape[0]}], "
                   f"{s.w.name}, {s.out.name}, rows={format_expr(s.row0)}:+{s.rows}, width={s.width}, kernel={s.kernel}, "
                   f"strides={s.strides}, dilations={s.dilations}, pads={s.pads})")
    elif isinstance(s, Winograd):
        out.append(f"{pad}winograd_f4x3({s.x.name}[{format_expr(s.image)}, :, {format_expr(s.row0)}:, {s.col0}:], "
                   f"{s.u.name}[:, {format_expr(s.k0)}:], {s.c.name}, rows={s.rows}, width={s.width}, "
                   f"scratch=({s.v.name}, {s.m.name}))")
    elif isinstance(s, ReduceTile):
        lanes = f", lanes={s.lanes}" if s.lanes != 1 else ""
        out.append(f"{pad}T.reduce_{s.fn.value}({s.src.name}, {s.dst.name}, dim={s.dim}, clear={s.clear}{lanes})")
    else:
        out.append(f"{pad}{s!r}")


def format_program(p: TileProgram) -> str:
    """The program, its schedule record (when it has one) on a comment line above it."""
    params = ", ".join(f"{b.name}: T.Tensor({list(b.shape)}, {b.dtype})" for b in p.params)
    if p.index_sites:
        params += f", {STATUS.name}: T.Tensor({list(STATUS.shape)}, {STATUS.dtype})  # {p.index_sites} index checks"
    out = [f"# schedule {p.schedule.describe()}"] if p.schedule is not None else []
    out.append(f"@T.prim_func  # inputs: {p.num_inputs}, outputs: {len(p.params) - p.num_inputs}")
    out += [f"# {n}" for n in p.notes]
    out.append(f"def {p.name}({params}):")
    grid = ", ".join(map(str, p.grid))
    bvars = ", ".join(v.name for v in p.block_vars)
    fitted = f"  # fitted from {p.fitted_from}" if p.fitted_from else ""
    fitted += f"  # {p.row_lanes} lanes a row" if p.row_lanes else ""
    out.append(f"    with T.Kernel({grid}, threads={p.threads}) as ({bvars}):{fitted}")
    for b in p.allocs:
        out.append(f"        {b.name} = T.alloc_{b.scope.value}({list(b.shape)}, {b.dtype})")
    for s in p.body:
        _stmt(s, 2, out)
    return "\n".join(out)
