"""Flash-style attention: QK^T, the row softmax and PV in one pass over key tiles.

For each tile of query rows, key/value tiles stream through: scores for the tile are
computed (with the group's scale and mask inlined), the running row max and row sum are
updated (online softmax), and the output accumulator is rescaled and advanced by P @ V.
A softmax written without its max shift (``exp(x) / sum(exp(x))``) keeps only the running
sum: the kernel computes what the graph says, overflow included.
The score matrix never exists beyond one tile. The attention pattern
(``patterns/attention.py``) recognised the softmax between the two products from its
primitives; this module tiles the match it is given.
"""
from __future__ import annotations

import math

from tilefuse.ir.dtypes import HALF_FLOATS, DType
from tilefuse.ir.graph import Node, Value
from tilefuse.ir.prims import ReduceFn, ScalarFn
from tilefuse.partition.model import FusedGroup
from tilefuse.patterns import AttentionMatch, Softmax
from tilefuse.target import CPU, Target
from tilefuse.tile_ir.ir import (
    Buffer,
    Call,
    Const,
    Expr,
    Fill,
    Gemm,
    IOp,
    Load,
    Loop,
    LoopKind,
    ReduceTile,
    Scope,
    Stmt,
    Store,
    TileProgram,
    Var,
    iop,
    subexpressions,
)
from tilefuse.tile_ir.lower.common import Names, divisor_tile, fill_cores, halve_while_idle, parallel, var_ids
from tilefuse.tile_ir.lower.elements import ElementBuilder, Index, broadcast_index
from tilefuse.tile_ir.lower.forward import forward_index
from tilefuse.tile_ir.lower.params import kernel_params
from tilefuse.tile_ir.schedule import AttentionSchedule

F32 = DType.FLOAT32


def lower_attention(group: FusedGroup, match: AttentionMatch, name: str,
                    target: Target = CPU) -> tuple[TileProgram, tuple[Value, ...]] | None:
    """With ``target.gemm.half_operand_tiles``, Q, K, V and the probabilities feeding P.V stay
    half-float in their tiles (scores, softmax state and the output stay fp32)."""
    fwd = forward_index(match.epilogue, [match.c2])
    return _Flash(group, match.c1, match.c2, match.softmax, fwd, name, target).build()


class _Flash:
    def __init__(self, group: FusedGroup, c1: Node, c2: Node, sm: Softmax, fwd, name: str, target: Target) -> None:
        self.group, self.c1, self.c2, self.sm, self.fwd, self.name = group, c1, c2, sm, fwd, name
        self.target = target
        half_tiles = target.gemm.half_operand_tiles
        dtypes = {v.type.dtype for v in (*c1.inputs, c2.inputs[1])}
        (only,) = dtypes if len(dtypes) == 1 else (None,)
        self.op = only if half_tiles and only in HALF_FLOATS else F32  # Q, K, V tiles
        self.names = Names()

    def build(self) -> tuple[TileProgram, tuple[Value, ...]]:
        c1, c2 = self.c1, self.c2
        s_shape = c1.outputs[0].type.shape
        batch, (m, n) = s_shape[:-2], s_shape[-2:]
        d = c1.inputs[0].type.shape[-1]
        dv = c2.outputs[0].type.shape[-1]
        even = bool(self.target.device.max_block_threads)  # tiles split evenly over a block's threads
        policy = self.target.attention
        bm, bn = _edge(m, policy.query_tile, even), _edge(n, policy.key_tile, even, policy.key_align)
        if m % bm:  # power-of-two query tiles, the last one partial: halved while cores idle
            bm = halve_while_idle(m, bm, math.prod(batch), self.target.device.cores, self.target.gemm.min_tile // 2)
        else:  # query tiles down to half the target's smallest tile where heads x tiles leave cores idle
            (bm,) = fill_cores((m,), [bm], math.prod(batch), self.target.device.cores, self.target.gemm.min_tile // 2)
        # Partial last tiles: global reads past the sequence are clamped (in_range), so a
        # query row past m computes row m - 1 again and writes it there (the same values);
        # keys past n score -inf and weigh nothing (the first key tile is whole, so every
        # row has a finite max)
        q_tail, k_tail = m % bm, n % bn
        qtiles, ktiles = -(-m // bm), -(-n // bn)
        kp = kernel_params(self.group)
        params, buffers, bindings, outs = kp.params, kp.buffers, kp.bindings, kp.outputs

        op = self.op
        tf32 = self.target.tf32_products and op is F32  # --precision tf32
        q = Buffer("q_tile", op, (bm, d), Scope.SHARED)
        kt_ = Buffer("k_tile", op, (d, bn), Scope.SHARED)
        s = Buffer("s_tile", F32, (bm, bn), Scope.FRAGMENT)
        # P overwrites the scores in place (each element reads only its own score): one
        # fp32 tile of registers fewer, what lets more query tiles share an SM
        p = s
        v_ = Buffer("v_tile", op, (bn, dv), Scope.SHARED)
        # P as P.V reads it: rounded to the operands' half type; and for exact float32
        # products on a device with blocks (FMA loops, each thread reading whole rows of P)
        # a tile of its own, placed where every thread can read it, so that the scores keep
        # a tile's register layout instead of a replica of every row in every thread
        fma_rows = op is F32 and not tf32 and self.target.device.mma_rows > 1
        ph = Buffer("p_half", op, (bm, bn), Scope.FRAGMENT) if op is not F32 else \
            Buffer("p_rows", F32, (bm, bn), Scope.SHARED) if fma_rows else p
        o = Buffer("o_tile", F32, (bm, dv), Scope.FRAGMENT)
        mrow, lrow = Buffer("row_max", F32, (bm,), Scope.FRAGMENT), Buffer("row_sum", F32, (bm,), Scope.FRAGMENT)
        tmax, tsum = Buffer("tile_max", F32, (bm,), Scope.FRAGMENT), Buffer("tile_sum", F32, (bm,), Scope.FRAGMENT)
        alpha = Buffer("rescale", F32, (bm,), Scope.FRAGMENT)
        bvars = tuple(Var(f"b{i}") for i in range(len(batch)))
        mt, jt = Var("bm"), self.names.var("kv")
        m0, n0 = iop(IOp.MUL, mt, bm), iop(IOp.MUL, jt, bn)
        c1_out, c2_out = c1.outputs[0], c2.outputs[0]
        tails = bool(q_tail or k_tail)
        tile_vars = {id(mt), id(jt)}
        # probabilities mapped before P.V (fake quantization): normalised within the one key tile
        quotient = self.sm.quotient
        mapped = quotient is not None
        assert not mapped or ktiles == 1, "the matcher keeps mapped probabilities to one key tile"

        def in_range(val: Value, idx: Index) -> Index:
            """A global element's index with each axis that follows the query tile or the
            key step clamped to the tensor (partial tiles: a row past m reads row m - 1, a
            key past n key n - 1)."""
            if not tails:
                return idx
            return tuple(iop(IOp.MIN, e, dim - 1) if dim > 1 and var_ids(e) & tile_vars else e
                         for e, dim in zip(idx, val.type.shape))

        def reader(own_row: Expr | None = None):
            """How the group's values are read; for an output stored from tile row
            ``own_row``, the attention result at that row (a clamped row past m reads its
            replica there, not another thread's row)."""
            def read(val: Value, idx: Index) -> Expr:
                if val is c1_out:
                    return _cast(Load(s, (iop(IOp.SUB, idx[-2], m0), iop(IOp.SUB, idx[-1], n0))), val.type.dtype)
                if val is c2_out:
                    r = own_row if own_row is not None else iop(IOp.SUB, idx[-2], m0)
                    if mapped:  # P was normalised before P.V
                        return _cast(Load(o, (r, idx[-1])), val.type.dtype)
                    ratio = Call(ScalarFn.DIV, (Load(o, (r, idx[-1])), Load(lrow, (r,))), F32)
                    return _cast(ratio, val.type.dtype)
                if val is quotient:  # softmax's probabilities, read for the map that follows them
                    r = iop(IOp.SUB, idx[-2], m0)
                    prob = Call(ScalarFn.DIV, (Load(p, (r, iop(IOp.SUB, idx[-1], n0))), Load(lrow, (r,))), F32)
                    return _cast(prob, val.type.dtype)
                return Load(buffers[id(val)], in_range(val, idx))

            return read

        buffers[id(c1_out)] = s
        buffers[id(c2_out)] = o
        if quotient is not None:
            buffers[id(quotient)] = p
        el = ElementBuilder(buffers, reader(), kp.sites)
        qa, kb = c1.inputs
        vb = c2.inputs[1]
        qb = broadcast_index(bvars, qa.type.shape[:-2], batch)
        kbb = broadcast_index(bvars, kb.type.shape[:-2], batch)
        vbb = broadcast_index(bvars, vb.type.shape[:-2], batch)
        neg_inf = Const(float("-inf"), F32)

        def f32(e: Expr, v: Value) -> Expr:
            return _cast(e, F32) if v.type.dtype is not F32 else e

        def tile(e: Expr, v: Value) -> Expr:  # an operand element as its tile holds it
            return e if v.type.dtype is op else f32(e, v)

        body: list[Stmt] = [
            *parallel(self.names, (bm, d), lambda ix: [Store(q, ix, tile(el.at(qa, qb + (iop(IOp.ADD, m0, ix[0]), ix[1])), qa))]),
            Fill(o, Const(0.0, F32)), Fill(lrow, Const(0.0, F32)), *([Fill(mrow, neg_inf)] if self.sm.shifted else []),
        ]
        x = self.sm.scores
        xb = broadcast_index(bvars, x.type.shape[:-2], batch)
        def k_elem(dd: Expr, j: Expr) -> Expr:
            return tile(el.at(kb, kbb + (dd, iop(IOp.ADD, n0, j))), kb)

        if _contiguous_along(k_elem, 0):  # K stored [keys, d] (K^T made by a Transpose): d innermost
            k_fill = parallel(self.names, (bn, d), lambda jx: [Store(kt_, (jx[1], jx[0]), k_elem(jx[1], jx[0]))])
        else:  # K^T stored as it is read (written transposed by the projection's epilogue)
            k_fill = parallel(self.names, (d, bn), lambda ix: [Store(kt_, ix, k_elem(ix[0], ix[1]))])
        def score(ix: Index) -> Expr:  # the softmax's input at tile element ix; -inf past the last key
            val = f32(el.at(x, xb + (iop(IOp.ADD, m0, ix[0]), iop(IOp.ADD, n0, ix[1]))), x)
            if not k_tail:
                return val  # (half-float scores are widened by the store into the fp32 tile)
            if x.type.dtype is not F32:  # where's branches of one type (_cast leaves F32 alone)
                val = Call(ScalarFn.CAST, (val,), F32)
            return Call(ScalarFn.WHERE, (iop(IOp.LT, iop(IOp.ADD, n0, ix[1]), n), val, neg_inf), F32)

        def exp_of(e: Expr) -> Expr:
            return Call(ScalarFn.EXP, (e,), F32)

        shifted = self.sm.shifted
        scores = parallel(self.names, (bm, bn), lambda ix: [Store(p, ix, score(ix))])  # (names in statement order)
        if shifted:  # online softmax: the running row max, the old terms rescaled by exp(old - new)
            normalise: list[Stmt] = [
                ReduceTile(p, tmax, ReduceFn.MAX, 1),
                *parallel(self.names, (bm,), lambda ix: [
                    Store(tmax, ix, Call(ScalarFn.MAX, (Load(mrow, ix), Load(tmax, ix)), F32)),
                    Store(alpha, ix, exp_of(Call(ScalarFn.SUB, (Load(mrow, ix), Load(tmax, ix)), F32))),
                    Store(mrow, ix, Load(tmax, ix)),
                ]),
                *parallel(self.names, (bm, bn), lambda ix: [
                    Store(p, ix, exp_of(Call(ScalarFn.SUB, (Load(p, ix), Load(mrow, (ix[0],))), F32))),
                ]),
            ]
        else:  # exp(x) / sum(exp(x)) as written: no max, nothing to rescale (exp(-inf) = 0 past the last key)
            normalise = [*parallel(self.names, (bm, bn), lambda ix: [Store(p, ix, exp_of(Load(p, ix)))])]
        # P rounded for P.V in a nest of its own: one nest writing both had TileLang put a
        # barrier in every iteration
        rounded = parallel(self.names, (bm, bn), lambda ix: [Store(ph, ix, _cast(Load(p, ix), op))]) if ph is not p else []
        pb = broadcast_index(bvars, c2.inputs[0].type.shape[:-2], batch)

        def mapped_prob(ix: Index) -> Expr:  # the map of row ix[0]'s normalised probability; 0 past the last key
            val = f32(el.at(c2.inputs[0], pb + (iop(IOp.ADD, m0, ix[0]), iop(IOp.ADD, n0, ix[1]))), c2.inputs[0])
            if not k_tail:
                return val
            return Call(ScalarFn.WHERE, (iop(IOp.LT, iop(IOp.ADD, n0, ix[1]), n), val, Const(0.0, F32)), F32)

        step: list[Stmt] = [
            *k_fill,
            Fill(s, Const(0.0, F32)),
            Gemm(q, kt_, s, tf32=tf32),
            *scores,
            *normalise,
            *([] if mapped else rounded),
            ReduceTile(p, tsum, ReduceFn.SUM, 1),
            *parallel(self.names, (bm,), lambda ix: [
                Store(lrow, ix, Call(ScalarFn.ADD, (
                    Call(ScalarFn.MUL, (Load(lrow, ix), Load(alpha, ix)), F32) if shifted else Load(lrow, ix),
                    Load(tsum, ix)), F32)),
            ]),
            *(parallel(self.names, (bm, dv), lambda ix: [
                Store(o, ix, Call(ScalarFn.MUL, (Load(o, ix), Load(alpha, (ix[0],))), F32)),
            ]) if shifted and not mapped else []),
            *([*parallel(self.names, (bm, bn), lambda ix: [Store(p, ix, mapped_prob(ix))]), *rounded] if mapped else []),
            *parallel(self.names, (bn, dv), lambda ix: [Store(v_, ix, tile(el.at(vb, vbb + (iop(IOp.ADD, n0, ix[0]), ix[1])), vb))]),
            Gemm(ph, v_, o, tf32=tf32),
        ]
        blocks = math.prod(batch) * qtiles
        waves = -(-blocks // self.target.device.cores)  # tiles per core for one wave
        one_wave = self.target.device.mma_rows > 1 and 2 < waves <= self.target.attention.one_wave_occupancy and ktiles <= 4
        if op is F32 and not tf32 and self.target.device.mma_rows > 1:
            # exact float32 products are FMA loops on the GPU: nothing for a pipeline to
            # overlap, and TileLang's unrolled stages of them took nvcc minutes
            stages = 0
            body.append(Loop(jt, ktiles, LoopKind.SERIAL, tuple(step)))
        else:
            stages = 1 if one_wave else 2
            body.append(Loop(jt, ktiles, LoopKind.PIPELINED, tuple(step), stages=stages))
        for val, ob in zip(self.group.outputs, outs):
            def store(ix: Index, val: Value = val, ob: Buffer = ob) -> list[Stmt]:
                # a row past m (a partial tile) holds row m - 1's values, computed from the
                # same clamped inputs: it writes them there again, read from its own row
                row = iop(IOp.ADD, m0, ix[0])
                idx = self.fwd[id(val)](bvars + (iop(IOp.MIN, row, m - 1) if q_tail else row, ix[1]))
                return [Store(ob, idx, ElementBuilder(buffers, reader(ix[0]), kp.sites).at(val, idx))]

            body += parallel(self.names, (bm, dv), store)
        grid = tuple(batch) + (qtiles,)
        last = "".join(f", last {what} tile {t}" for what, t in (("query", q_tail), ("key", k_tail)) if t)
        form = ("" if self.sm.shifted else ", softmax without a max shift") + (", probabilities mapped before P.V" if mapped else "")
        notes = (f"flash attention: query tiles {bm}, key tiles {bn}, head dims {d}/{dv}, grid {grid}{last}{form}",)
        state = (mrow, lrow, tmax, tsum, alpha) if self.sm.shifted else (lrow, tsum)
        allocs = (q, kt_, s, v_, o, *state, *([ph] if ph is not p else []))
        threads = 256 if bm >= 128 else 128  # two warpgroups for 128 query rows
        if one_wave:
            notes = (notes[0] + f", {waves} tiles resident per SM (one wave), K/V loads unpipelined",)
        occupancy = waves if one_wave else 0
        schedule = AttentionSchedule(
            batch=tuple(batch), queries=m, keys=n, head_dim=d, value_dim=dv, query_tile=bm, key_tile=bn, threads=threads,
            stages=stages, occupancy=occupancy, operands=op, tf32=tf32)
        program = TileProgram(self.name, tuple(params), len(params) - len(outs), grid, (*bvars, mt), threads, allocs,
                              tuple(body), notes, occupancy=occupancy, schedule=schedule)
        return program, tuple(bindings)


def _edge(n: int, cap: int, even: bool, align: int = 1) -> int:
    """A tile edge for a sequence of ``n``: its largest divisor up to ``cap``, unless that is
    under a quarter of what a tile could hold (ViT's 197 tokens, a prime, gave 1) or, where
    a block's threads split every tile evenly (``even``: the GPU), not a power of two (a
    17 x 17 score tile splits over one thread only; CLIP's 50 or T5's 150 tokens gave
    tiles of 25 and 50): then on the GPU the power of two that covers ``n``, up to
    ``cap``, with a partial last tile; on a host the fewest tiles of at most ``cap`` cut
    evenly, the edge rounded up to a multiple of ``align`` (a vector of keys), so the
    last tile computes few rows or keys past ``n`` (197 tokens in tiles of 64 computed
    256: 1.7x the scores)."""
    d = divisor_tile(n, cap)
    if 4 * d >= min(n, cap) and (not even or d & (d - 1) == 0) and d % align == 0:
        return d
    if even:
        return min(cap, 1 << (n - 1).bit_length())
    tiles = -(-n // cap)  # every tile starts before n: (tiles - 1) x edge < n, edge <= cap
    edge = -(-(-(-n // tiles)) // align) * align
    return edge if edge <= cap else -(-n // tiles)


def _cast(e: Expr, dtype: DType) -> Expr:
    return e if dtype is F32 else Call(ScalarFn.CAST, (e,), dtype)


def _contiguous_along(elem, axis: int) -> bool:
    """Whether the global loads of ``elem(i, j)`` run along tile axis ``axis`` in memory:
    their last index mentions that axis's variable and not the other's. A fill nest puts
    that axis innermost, so neighbouring threads read neighbouring elements."""
    probe = (Var("_probe_i"), Var("_probe_j"))
    e = elem(*probe)
    mine, other = id(probe[axis]), id(probe[1 - axis])
    loads = [x for x in subexpressions(e) if isinstance(x, Load) and x.buffer.scope is Scope.GLOBAL]
    lasts = [var_ids(x.indices[-1]) for x in loads if x.indices]
    return bool(lasts) and any(mine in m and other not in m for m in lasts) and not any(other in m for m in lasts)
