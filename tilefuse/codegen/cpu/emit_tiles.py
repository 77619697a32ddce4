"""Tile statements as straightforward C loops: Fill, Copy, Gemm, ReduceTile; a PanelGemm
as a call of the prelude's product core by a packed weight.

Semantics are the interpreter's (``tilefuse.tile_ir.interpret``): a Copy reads zeros
outside its source and skips elements outside its destination, converting dtypes; a
Gemm accumulates ``c += op(a) @ op(b)`` in float32 when c is a float of 32 bits or less
(in c's own dtype otherwise); a ReduceTile reduces a 2-D tile along one dim.
"""
from __future__ import annotations

import math
from typing import Sequence

from tilefuse.codegen.cpu.c_types import compute, convert, literal, load, round_to, store, store_as
from tilefuse.codegen.cpu.emit_expr import Names, StmtExprs, cident, flat_index
from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ReduceFn
from tilefuse.tile_ir.ir import (Copy, Fill, Gemm, LaneTaps, PanelGemm, PlaneTaps, ReduceTile, StridedGemm, TapGemm, Transpose, Winograd,
                                 transpose_dims)


def _loops(header_vars: Sequence[tuple[str, int]], body: Sequence[str], pragma: str = "") -> list[str]:
    out = [pragma] if pragma else []
    for d, (v, n) in enumerate(header_vars):
        out.append("    " * d + f"for (int64_t {v} = 0; {v} < {n}; ++{v}) {{")
    out += ["    " * len(header_vars) + x for x in body]
    out += ["    " * d + "}" for d in reversed(range(len(header_vars)))]
    return out


def fill(s: Fill) -> list[str]:
    b, n = s.buffer, max(math.prod(s.buffer.shape), 1)
    value = float(s.value.value) if b.dtype.is_float else int(s.value.value)
    if value == 0 and not (b.dtype.is_float and math.copysign(1.0, value) < 0):
        return [f"memset({cident(b.name)}, 0, {n * b.dtype.itemsize});"]
    v = store(b.dtype, literal(s.value.value, b.dtype))
    return [f"for (int64_t _i = 0; _i < {n}; ++_i) {cident(b.name)}[_i] = {v};"]


def copy(s: Copy, se: StmtExprs, names: Names) -> list[str]:
    """``se`` renders the source offsets, then the destination offsets."""
    src, dst = s.src, s.dst
    ns = len(src.offsets)
    so = [se.root(k) for k in range(ns)]
    do = [se.root(ns + k) for k in range(len(dst.offsets))]
    loops = [(names.temp("c"), n) if n != 1 else None for n in dst.extents]
    dst_at = [_plus(o, lp[0] if lp else None) for o, lp in zip(do, loops)]
    src_at = _source_positions(src.extents, dst.extents, so, loops)
    body: list[str] = []

    def checked(positions: list[str], offsets_root: int, region_extents: Sequence[int], shape: Sequence[int]) -> list[str]:
        conds = []
        for d, (pos, e, n) in enumerate(zip(positions, region_extents, shape)):
            b = se.bounds(se.roots[offsets_root + d])
            if b is not None and b[0] >= 0 and b[1] + e <= n:
                continue
            if not pos.isidentifier():
                name = names.temp()
                body.append(f"const int64_t {name} = {pos};")
                positions[d] = pos = name
            conds.append(f"{pos} >= 0 && {pos} < {n}")
        return conds

    src_ok = checked(src_at, 0, src.extents, src.buffer.shape)
    dst_ok = checked(dst_at, ns, dst.extents, dst.buffer.shape)
    value = load(src.buffer.dtype, f"{cident(src.buffer.name)}[{flat_index(src_at, src.buffer.shape)}]")
    if src_ok:
        value = f"({' && '.join(src_ok)} ? {value} : {literal(0, src.buffer.dtype)})"
    write = (f"{cident(dst.buffer.name)}[{flat_index(dst_at, dst.buffer.shape)}] = "
             f"{store_as(value, src.buffer.dtype, dst.buffer.dtype)};")
    body.append(f"if ({' && '.join(dst_ok)}) {write}" if dst_ok else write)
    return se.lines + _loops([lp for lp in loops if lp], body)


def _plus(offset: str, var: str | None) -> str:
    if var is None:
        return offset
    return var if offset == "0" else f"({offset} + {var})"


def _source_positions(src_ext: Sequence[int], dst_ext: Sequence[int], so: Sequence[str],
                      loops: Sequence[tuple[str, int] | None]) -> list[str]:
    """Source index per dim for the element at the destination loop indices; extents
    agree up to unit dims (or, failing that, element by element in row-major order)."""
    s_dims = [d for d, e in enumerate(src_ext) if e != 1]
    d_dims = [d for d, e in enumerate(dst_ext) if e != 1]
    if [src_ext[d] for d in s_dims] == [dst_ext[d] for d in d_dims]:
        var = {}
        for sd, dd in zip(s_dims, d_dims):
            loop = loops[dd]
            assert loop is not None  # a destination dim of extent > 1 has its loop
            var[sd] = loop[0]
        return [_plus(o, var.get(d)) for d, o in enumerate(so)]
    flat = flat_index([lp[0] if lp else "0" for lp in loops], dst_ext)
    out, stride = [], math.prod(src_ext)
    for o, e in zip(so, src_ext):
        stride //= e
        pos = f"({flat})" if stride == 1 else f"({flat}) / {stride}"
        out.append(_plus(o, f"({pos} % {e})" if e != 1 else None))
    return out


def gemm(s: Gemm, parallel: bool, zero: str = "0") -> list[str]:
    """``c += op(a) @ op(b)``: fp32 tiles without transposes through the prelude's
    register-blocked ``tf_gemm_f32`` (``zero``: C for whether it starts c at zero,
    ``first_products.py``); otherwise i-k-j order (unit stride over j), or i-j-k dot
    products when b is transposed; half c accumulates one row at a time in float."""
    (m, k) = s.a.shape[::-1] if s.trans_a else s.a.shape
    n = s.c.shape[1]
    wide = DType.FLOAT32 if s.c.dtype.is_float and s.c.dtype.itemsize <= 4 else s.c.dtype
    acc_t = compute(wide)
    a, b, c = cident(s.a.name), cident(s.b.name), cident(s.c.name)

    def at(buf: str, dtype: DType, r: str, col: str, shape: Sequence[int], trans: bool) -> str:
        i = f"{col} * {shape[1]} + {r}" if trans else f"{r} * {shape[1]} + {col}"
        return convert(load(dtype, f"{buf}[{i}]"), dtype, wide)

    if not (s.trans_a or s.trans_b) and s.a.dtype is s.b.dtype is s.c.dtype is DType.FLOAT32:
        return _gemm_f32(a, b, c, m, n, k, parallel, zero)
    assert zero == "0", "only the product core starts a tile at zero"
    a_ik = at(a, s.a.dtype, "_i", "_p", s.a.shape, s.trans_a)
    b_kj = at(b, s.b.dtype, "_p", "_j", s.b.shape, s.trans_b)
    c_ij = convert(load(s.c.dtype, f"{c}[_i * {n} + _j]"), s.c.dtype, wide)
    put = store_as("_acc", wide, s.c.dtype)
    if s.trans_b:
        body = [f"{acc_t} _acc = {c_ij};", f"for (int64_t _p = 0; _p < {k}; ++_p) _acc += {a_ik} * {b_kj};",
                f"{c}[_i * {n} + _j] = {put};"]
        rows = _loops([("_j", n)], body)
    elif s.c.dtype is wide:
        rows = _loops([("_p", k)], [f"const {acc_t} _aik = {a_ik};", "#pragma omp simd",
                                    f"for (int64_t _j = 0; _j < {n}; ++_j) {c}[_i * {n} + _j] += _aik * {b_kj};"])
    else:
        rows = [f"{acc_t} _row[{n}];", f"for (int64_t _j = 0; _j < {n}; ++_j) _row[_j] = {c_ij};"]
        rows += _loops([("_p", k)], [f"const {acc_t} _aik = {a_ik};", "#pragma omp simd",
                                     f"for (int64_t _j = 0; _j < {n}; ++_j) _row[_j] += _aik * {b_kj};"])
        rows += [f"for (int64_t _j = 0; _j < {n}; ++_j) {{ const {acc_t} _acc = _row[_j]; {c}[_i * {n} + _j] = {put}; }}"]
    pragma = "#pragma omp parallel for" if parallel else ""
    return ["{"] + ["    " + x for x in _loops([("_i", m)], rows, pragma)] + ["}"]


def panel_gemm(s: PanelGemm, se: StmtExprs, zero: str = "0") -> list[str]:
    """The prelude's product core by a packed weight (``PANEL_PRELUDE``; integer panels:
    ``INT8_PANEL_PRELUDE``); ``se`` renders
    the region's offsets, then the first panel and the first weight row. Rows of the
    region past the end of A are not passed (a partial last row tile): where they may not
    all be, a product that starts its tile at zero (``zero``) zeroes the tile first.
    ``columns`` (rendered after the first weight row) is the core's column count where
    set: a partial last column tile's columns past it are not computed (nor zeroed), and
    no store takes them."""
    a = s.a.buffer
    rank = len(a.shape)
    offsets = [se.root(k) for k in range(rank)]
    first, k0 = se.root(rank), se.root(rank + 1)
    (bm, n), lda, rows_of_a = s.c.shape, a.shape[-1], a.shape[-2]
    cols = str(n) if s.columns is None else se.root(rank + 2)
    k, kp = s.a.extents[-1], s.k_rows
    lines = list(se.lines)
    bounds = se.bounds(se.roots[rank - 2])
    rows = str(bm)
    if bounds is None or bounds[0] < 0 or bounds[1] + bm > rows_of_a:
        left = f"{rows_of_a} - ({offsets[-2]})"
        rows = f"({left} < {bm} ? ({left} > 0 ? {left} : 0) : {bm})"
        if zero != "0":
            clear = f"memset({cident(s.c.name)}, 0, {bm * n * s.c.dtype.itemsize});"
            lines.append(clear if zero == "1" else f"if ({zero}) {clear}")
            zero = "0"
    panel = f"{cident(s.b.name)} + ({first}) * {kp * s.width}" if first != "0" else cident(s.b.name)
    if s.k_group > 1:
        assert zero == "0", "only the float product core starts a tile at zero"
        core, flag = ("tf_panel_gemm_u8s16" if s.b.dtype is DType.INT16 else "tf_panel_gemm_u8s8"), ""
    else:
        core, flag = "tf_panel_gemm_f32", f", {zero}"
    return lines + [f"{core}({rows}, {cols}, {k}, {cident(a.name)} + {flat_index(offsets, a.shape)}, {lda}, {panel}, "
                    f"{kp}, {k0}, {cident(s.c.name)}, {n}, {s.k_block}{flag});"]


def strided_operands(s: StridedGemm, se: StmtExprs) -> tuple[str, int, str, int]:
    """C for a StridedGemm's operands where they lie: A's first element and row stride,
    B's first element and row stride; ``se`` renders A's region offsets, then B's. A in
    row blocks (``a_blocks``): its tile's first element and the blocks' length (K), the
    region's first K step apart (``strided_a_step``)."""
    a, b = s.a.buffer, s.b.buffer
    ra = len(a.shape)
    a_idx = [se.root(i) for i in range(ra)]
    a_at = flat_index(a_idx[:-1] + ["0"] if s.a_blocks else a_idx, a.shape)
    b_at = flat_index([se.root(ra + i) for i in range(len(b.shape))], b.shape)
    return (f"{cident(a.name)} + {a_at}", a.shape[-1], f"{cident(b.name)} + {b_at}",
            math.prod(b.shape[s.k_axis + 1:]))


def strided_a_step(s: StridedGemm, se: StmtExprs) -> str:
    """C for the first K step of a StridedGemm's A region (its last offset)."""
    return se.root(len(s.a.buffer.shape) - 1)


def strided_call(s: StridedGemm, se: StmtExprs, m: str, n: str, a: str, lda: int, b: str, ldb: int, c: str, ldc: int,
                 zero: str) -> str:
    """The core's call for rows [0, m) x columns [0, n) of a StridedGemm: ``a`` its first
    row (of A as stored: rows lda apart; in row blocks: the first row of a block, K = lda
    long), ``b`` its first column, into ``c`` (rows ldc apart)."""
    k = s.a.extents[-1]
    if s.a_blocks:
        return f"tf_gemm_blocks_f32({m}, {n}, {k}, {a}, {lda}, {strided_a_step(s, se)}, {b}, {ldb}, {c}, {ldc}, {zero});"
    return f"tf_gemm_f32({m}, {n}, {k}, {a}, {lda}, {b}, {ldb}, {c}, {ldc}, {zero});"


def strided_gemm(s: StridedGemm, se: StmtExprs, zero: str = "0") -> list[str]:
    """The prelude's register-blocked core on both operands where they lie; ``se``
    renders A's region offsets, then B's; ``zero``: as for ``gemm``."""
    a, lda, b, ldb = strided_operands(s, se)
    m, n = s.c.shape
    return list(se.lines) + [strided_call(s, se, str(m), str(n), a, lda, b, ldb, cident(s.c.name), n, zero)]


def tap_gemm(s: TapGemm, se: StmtExprs, table: str, zero: str = "0") -> list[str]:
    """The prelude's core over tap rows (``TAP_PRELUDE``): A's rows where they lie, B's
    rows at the offsets of the static table ``table`` (printed here, once per statement)
    into the on-chip buffer; ``se`` renders A's region offsets."""
    a = s.a.buffer
    a_at = flat_index([se.root(i) for i in range(len(a.shape))], a.shape)
    (m, n), k = s.c.shape, len(s.offsets)
    return [*se.lines, *_offset_table(table, s.offsets),
            f"tf_tap_gemm_f32({m}, {n}, {k}, {cident(a.name)} + {a_at}, {a.shape[-1]}, {cident(s.b.name)}, {table}, "
            f"{cident(s.c.name)}, {n}, {zero});"]


def transpose(s: Transpose, se: StmtExprs) -> list[str]:
    """The prelude's block transpose (``TRANSPOSE_PRELUDE``); ``se`` renders the source
    offsets, then the destination's. Both regions' rows are runs (``verify``), one row
    dim's stride apart (``transpose_dims``)."""
    src, dst = s.src, s.dst
    ns = len(src.offsets)
    s_at = flat_index([se.root(i) for i in range(ns)], src.buffer.shape)
    d_at = flat_index([se.root(ns + i) for i in range(len(dst.offsets))], dst.buffer.shape)
    (s_row, rows, cols), (d_row, _, _) = transpose_dims(src), transpose_dims(dst)
    ss, ds = math.prod(src.buffer.shape[s_row + 1:]), math.prod(dst.buffer.shape[d_row + 1:])
    return [*se.lines, f"tf_transpose_f32({cident(src.buffer.name)} + {s_at}, {ss}, "
            f"{cident(dst.buffer.name)} + {d_at}, {ds}, {rows}, {cols});"]


def lane_taps(s: LaneTaps, table: str) -> list[str]:
    """The prelude's depthwise taps over vectors of channels (``TRANSPOSE_PRELUDE``), the
    taps' offsets in the static table ``table`` (printed here, once per statement)."""
    k = len(s.offsets)
    return [*_offset_table(table, s.offsets),
            f"tf_lane_taps_f32({cident(s.x.name)}, {cident(s.w.name)}, {cident(s.out.name)}, {s.rows}, {s.width}, "
            f"{s.row_step}, {s.col_step}, {table}, {k});"]


def plane_taps(s: PlaneTaps, se: StmtExprs) -> list[str]:
    """The prelude's depthwise taps over channel planes (``PLANE_TAPS_PRELUDE``); ``se``
    renders the image, the first channel and the first output row. x [N, C, H, W] is
    dense, so the channels' planes lie ``H * W`` apart from the first one's."""
    _, chans, h, w = s.x.shape
    image, ch0, row0 = se.root(0), se.root(1), se.root(2)
    (kh, kw), (sy, sx), (dy, dx), (top, left) = s.kernel, s.strides, s.dilations, s.pads
    return [*se.lines, f"tf_plane_taps_f32({cident(s.x.name)} + (({image}) * {chans} + ({ch0})) * {h * w}, {s.w.shape[0]}, "
            f"{h}, {w}, {cident(s.w.name)}, {kh}, {kw}, {sy}, {sx}, {dy}, {dx}, {top}, {left}, {row0}, {s.rows}, {s.width}, "
            f"{cident(s.out.name)}, {s.out.shape[1]});"]


def winograd(s: Winograd, se: StmtExprs) -> list[str]:
    """The prelude's F(4 x 4, 3 x 3) convolution (``WINOGRAD_PRELUDE``); ``se`` renders
    the image, the first input row and the first output channel. x [N, C, H, W] and u
    in blocks of c's rows (``Winograd.u``) are dense, so the image's planes and the block
    of ``k0`` are offsets."""
    _, chans, h, w = s.x.shape
    image, row0, k0 = se.root(0), se.root(1), se.root(2)
    return [*se.lines, f"tf_winograd43_f32({cident(s.x.name)} + ({image}) * {chans * h * w}, {chans}, {h}, {w}, {row0}, {s.col0}, "
            f"{cident(s.u.name)} + ({k0}) * {36 * chans}, {s.c.shape[0]}, {cident(s.v.name)}, {s.v.shape[1]}, "
            f"{cident(s.m.name)}, {cident(s.c.name)}, {s.c.shape[1]}, {s.rows}, {s.width});"]


def _offset_table(name: str, offsets: Sequence[int]) -> list[str]:
    """A static table of int32 offsets, 16 a line (a TapGemm's or LaneTaps' rows)."""
    rows = [", ".join(map(str, offsets[i:i + 16])) for i in range(0, len(offsets), 16)]
    return [f"static const int32_t {name}[{len(offsets)}] = {{", *(f"    {r}," for r in rows), "};"]


def _gemm_f32(a: str, b: str, c: str, m: int, n: int, k: int, parallel: bool, zero: str) -> list[str]:
    """The prelude's register-blocked product; a parallel one splits c's rows into one
    block per thread (multiples of 6 rows, the micro-kernel's height)."""
    if not parallel:
        return [f"tf_gemm_f32({m}, {n}, {k}, {a}, {k}, {b}, {n}, {c}, {n}, {zero});"]
    return ["{", "    #pragma omp parallel for schedule(static)",
            f"    for (int64_t _i = 0; _i < {m}; _i += 24) {{",
            f"        const int64_t _r = {m} - _i < 24 ? {m} - _i : 24;",
            f"        tf_gemm_f32(_r, {n}, {k}, {a} + _i * {k}, {k}, {b}, {n}, {c} + _i * {n}, {n}, {zero});",
            "    }", "}"]


_COMBINE = {ReduceFn.SUM: "{a} + {b}", ReduceFn.PROD: "{a} * {b}"}


def _combine(fn: ReduceFn, dtype: DType, a: str, b: str) -> str:
    if fn in _COMBINE:
        return _COMBINE[fn].format(a=a, b=b)
    w = {DType.FLOAT64: "f64"}.get(dtype, "f32" if dtype.is_float else ("i64" if dtype.is_signed else "u64"))
    return f"tf_{'max' if fn is ReduceFn.MAX else 'min'}_{w}({a}, {b})"


def _identity(fn: ReduceFn, dtype: DType) -> str:
    import numpy as np

    return literal(np.asarray(fn.identity(dtype.numpy)).item(), dtype)


def reduce(s: ReduceTile) -> list[str]:
    """dst[r] (op)= reduce over one dim of the 2-D src, accumulated in the compute type
    (int64 for integers, like numpy's sum)."""
    rows, cols = s.src.shape
    acc_d = s.src.dtype.compute if s.src.dtype.is_float else (DType.INT64 if s.src.dtype.is_signed else DType.UINT64)
    if s.src.dtype is DType.BOOL:
        acc_d = DType.INT64
    t = compute(acc_d)
    src, dst = cident(s.src.name), cident(s.dst.name)
    x = convert(load(s.src.dtype, f"{src}[_r * {cols} + _q]"), s.src.dtype, acc_d)
    acc = "_acc"

    def finish(idx: str, value: str) -> str:
        v = convert(value, acc_d, s.dst.dtype)
        if not s.clear:
            old = load(s.dst.dtype, f"{dst}[{idx}]")
            v = round_to(s.dst.dtype, _combine(s.fn, s.dst.dtype.compute, old, v))
        return f"{dst}[{idx}] = {store(s.dst.dtype, v)};"

    ident = _identity(s.fn, acc_d)
    if s.dim == 1 and s.lanes > 1:  # vector lanes (tile_ir/passes/lanes.py): element q into value q % lanes
        lanes = s.lanes
        lx = convert(load(s.src.dtype, f"{src}[_r * {cols} + _q0 + _v]"), s.src.dtype, acc_d)
        body = [f"{t} _l[{lanes}];", f"for (int _v = 0; _v < {lanes}; ++_v) _l[_v] = {ident};",
                f"for (int64_t _q0 = 0; _q0 < {cols}; _q0 += {lanes}) {{",
                "    #pragma omp simd",
                f"    for (int _v = 0; _v < {lanes}; ++_v) _l[_v] = {_combine(s.fn, acc_d, '_l[_v]', lx)};",
                "}",
                f"{t} {acc} = _l[0];",
                f"for (int _v = 1; _v < {lanes}; ++_v) {acc} = {_combine(s.fn, acc_d, acc, '_l[_v]')};",
                finish("_r", acc)]
        return ["{"] + ["    " + y for y in _loops([("_r", rows)], body)] + ["}"]
    if s.dim == 1:
        body = [f"{t} {acc} = {ident};",
                f"for (int64_t _q = 0; _q < {cols}; ++_q) {acc} = {_combine(s.fn, acc_d, acc, x)};", finish("_r", acc)]
        return ["{"] + ["    " + y for y in _loops([("_r", rows)], body)] + ["}"]
    lines = [f"{t} {acc}[{cols}];", f"for (int64_t _q = 0; _q < {cols}; ++_q) {acc}[_q] = {ident};"]
    step = _combine(s.fn, acc_d, f"{acc}[_q]", x)
    lines += _loops([("_r", rows)], [f"for (int64_t _q = 0; _q < {cols}; ++_q) {acc}[_q] = {step};"])
    lines.append(f"for (int64_t _q = 0; _q < {cols}; ++_q) {finish('_q', f'{acc}[_q]')}")
    return ["{"] + ["    " + y for y in lines] + ["}"]
