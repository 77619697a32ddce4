"""Accumulator epilogues (tile_ir/passes/epilogues.py): on a device with blocks, a register
accumulator whose epilogue reads other threads' elements gets a shared mirror (an alloc, a
bulk copy after its last product, its later loads retargeted), in the branches that need
it where only some do; epilogue nests storing a register accumulator's results get a
staging (a shared tile copied out in rectangles, transposed where the output runs along
the accumulator's rows). The verifier refuses stagings whose pieces are not what the store
writes; the CUDA printer prints what the program says."""
import dataclasses
import re

import pytest

from tilefuse.codegen.cuda.emit import emit_tilelang
from tilefuse.errors import CompileError, GraphError
from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ScalarFn
from tilefuse.target import CPU, CUDA_SM90A
from tilefuse.tile_ir import format_program, verify_program
from tilefuse.tile_ir.ir import (Buffer, Call, Const, Copy, Fill, Gemm, If, IOp, Load, Loop, LoopKind, Piece, Scope, Staging,
                                 Store, TileProgram, Var, const_index, iop, statements, subexpressions)
from tilefuse.tile_ir.passes import DeviceOptions, for_device, stage_epilogues

F16, F32 = DType.FLOAT16, DType.FLOAT32
GPU = CUDA_SM90A.device
I, J = Var("i"), Var("j")


def _nest(rows, cols, store, outer=I, inner=J):
    return Loop(outer, rows, LoopKind.PARALLEL, (Loop(inner, cols, LoopKind.PARALLEL, (store,)),))


def _product(n: int, outputs: tuple[Buffer, ...], epilogue, grid: int = 1) -> TileProgram:
    """A 64 x ``n`` half-float product on tensor cores (128 threads), then ``epilogue(acc)``:
    the statements that read its accumulator."""
    a, b = Buffer("a", F16, (64, 64), Scope.GLOBAL), Buffer("b", F16, (64, n), Scope.GLOBAL)
    sa, sb = Buffer("sa", F16, (64, 64), Scope.SHARED), Buffer("sb", F16, (64, n), Scope.SHARED)
    acc = Buffer("acc", F32, (64, n), Scope.FRAGMENT)
    body = (_nest(64, 64, Store(sa, (I, J), Load(a, (I, J)))),
            _nest(64, n, Store(sb, (I, J), Load(b, (I, J)))),
            Fill(acc, const_index(0)),
            Gemm(sa, sb, acc),
            *epilogue(acc))
    return TileProgram("product", (a, b, *outputs), 2, (grid,), (Var("bx"),), 128, (sa, sb, acc), body)


def _emit(p: TileProgram) -> str:
    return emit_tilelang(p, CUDA_SM90A.codegen, GPU).text


def _stagings(p: TileProgram) -> list[Staging]:
    return [s.staging for s in statements(p.body) if isinstance(s, Loop) and s.staging is not None]


def _mirror_copies(p: TileProgram) -> list[Copy]:
    return [s for s in statements(p.body) if isinstance(s, Copy) and s.src.buffer.scope is Scope.FRAGMENT]


Y = Buffer("y", F32, (64, 64), Scope.GLOBAL)


def _own(acc):  # y[i, j] = acc[i, j] + 1: each thread its own elements
    return (_nest(64, 64, Store(Y, (I, J), Call(ScalarFn.ADD, (Load(acc, (I, J)), Const(1.0, F32)), F32))),)


def _norm(acc, out=Y):  # y[i, j] = acc[i, j] / acc[i, 0]: another thread's element
    return (_nest(64, 64, Store(out, (I, J), Call(ScalarFn.DIV, (Load(acc, (I, J)), Load(acc, (I, const_index(0)))), F32))),)


def test_an_own_element_epilogue_reads_registers_and_is_staged():
    p = for_device(_product(64, (Y,), _own), GPU)
    assert not _mirror_copies(p) and [b.name for b in p.allocs] == ["sa", "sb", "acc"]
    (staging,) = _stagings(p)
    assert not staging.transposed and staging.pad == 4 and len(staging.pieces) == 1  # 16 bytes of float32
    piece = staging.pieces[0]
    assert (piece.first, piece.width, [e for _, e in piece.region]) == (0, 64, [64, 64])
    verify_program(p, CUDA_SM90A)
    text = _emit(p)
    assert '_out0 = T.alloc_shared((64, 68), "float32")' in text and "T.copy(_out0[0:64, 0:64], y[0:64, 0:64])" in text
    assert stage_epilogues(p, GPU) == p  # decided once


def test_an_epilogue_that_reads_other_threads_elements_reads_a_mirror():
    p = for_device(_product(64, (Y,), _norm), GPU)
    (copy,) = _mirror_copies(p)
    assert copy.bulk and copy.dst.buffer.name == "acc_s" and copy.dst.buffer.scope is Scope.SHARED
    assert [b.name for b in p.allocs] == ["sa", "sb", "acc", "acc_s"]
    assert isinstance(p.body[-2], Copy) and p.body[-2] is copy  # right after the product
    reads = {x.buffer.name for s in statements(p.body[-1:]) for x in _loads(s)}
    assert reads == {"acc_s"} and not _stagings(p)  # the mirror is shared memory: nothing staged
    verify_program(p, CUDA_SM90A)
    text = _emit(p)
    assert 'acc_s = T.alloc_shared((64, 64), "float32")' in text and "T.copy(acc, acc_s)" in text
    assert "(acc_s[i, j] / acc_s[i, 0])" in text
    assert stage_epilogues(p, GPU) == p  # mirrors are made once
    # a bulk copy between on-chip tiles must be whole tiles of one shape (the printer's T.copy(a, b))
    half = dataclasses.replace(copy, dst=dataclasses.replace(copy.dst, extents=(32, 64)),
                               src=dataclasses.replace(copy.src, extents=(32, 64)))
    body = tuple(half if s is copy else s for s in p.body)
    with pytest.raises(GraphError, match="a bulk copy fills a whole on-chip tile"):
        verify_program(dataclasses.replace(p, body=body), CUDA_SM90A)


def _loads(s):
    if isinstance(s, Store):
        return [x for e in (s.value, *s.indices) for x in subexpressions(e) if isinstance(x, Load)]
    return []


def test_only_the_branches_that_need_it_read_a_mirror():
    """Packed siblings: a tile-uniform branch per sibling; one normalises (other threads'
    elements), the other reads its own: only the first copies the accumulator."""
    z = Buffer("z", F32, (64, 64), Scope.GLOBAL)
    bx = Var("bx")

    def siblings(acc):
        return (If(iop(IOp.EQ, bx, 0), _norm(acc, z)), If(iop(IOp.EQ, bx, 1), _own(acc)))

    p = for_device(_product(64, (Y, z), siblings, grid=2), GPU)
    first, second = p.body[-2:]
    assert isinstance(first.body[0], Copy) and first.body[0].dst.buffer.name == "acc_s"
    assert not any(isinstance(s, Copy) for s in second.body)
    assert len(_mirror_copies(p)) == 1 and len(_stagings(p)) == 1  # the register branch is staged
    assert second.body[0].staging is not None and first.body[1].staging is None
    verify_program(p, CUDA_SM90A)
    text = _emit(p)
    assert re.search(r"if \(bx == 0\):\n\s+T\.copy\(acc, acc_s\)\n", text)
    assert "T.copy(_out0[0:64, 0:64], y[0:64, 0:64])" in text


def test_an_output_along_the_accumulators_rows_is_staged_transposed():
    """acc (64 rows, 32 columns) written [32, 64] (attention's K as [d, seq]): the nest
    runs (columns, rows) and reads acc[row, col]; the tile is [col, row]."""
    yt = Buffer("yt", F32, (32, 64), Scope.GLOBAL)

    def transposed(acc):
        return (_nest(32, 64, Store(yt, (I, J), Load(acc, (J, I)))),)

    p = for_device(_product(32, (yt,), transposed), GPU)
    (staging,) = _stagings(p)
    assert staging.transposed and not _mirror_copies(p)
    verify_program(p, CUDA_SM90A)
    text = _emit(p)
    assert '_out0 = T.alloc_shared((32, 68), "float32")' in text
    assert "for j, i in T.Parallel(64, 32):" in text and "_out0[i, j] = acc[j, i]" in text
    assert "T.copy(_out0[0:32, 0:64], yt[0:32, 0:64])" in text


def test_heads_are_copied_out_in_pieces():
    """A 64-column tile written [head, row, 32]: two pieces, one per head."""
    heads = Buffer("heads", F32, (2, 64, 32), Scope.GLOBAL)

    def split(acc):
        at = (iop(IOp.FLOORDIV, J, 32), I, iop(IOp.MOD, J, 32))
        return (_nest(64, 64, Store(heads, at, Load(acc, (I, J)))),)

    p = for_device(_product(64, (heads,), split), GPU)
    (staging,) = _stagings(p)
    assert [(x.first, x.width) for x in staging.pieces] == [(0, 32), (32, 32)]
    verify_program(p, CUDA_SM90A)
    text = _emit(p)
    assert "T.copy(_out0[0:64, 0:32], heads[0, 0:64, 0:32])" in text
    assert "T.copy(_out0[0:64, 32:64], heads[1, 0:64, 0:32])" in text


def test_options_and_the_cpu():
    own = _product(64, (Y,), _own)
    p = for_device(own, GPU, DeviceOptions(epilogue_in_registers=False))
    assert len(_mirror_copies(p)) == 1 and not _stagings(p)  # every accumulator through a mirror
    assert not _stagings(for_device(own, GPU, DeviceOptions(staged_stores=False)))
    assert _stagings(for_device(own, GPU, DeviceOptions(staging_pad=0)))[0].pad == 0
    assert for_device(own, CPU.device) == own


def test_the_verifier_and_the_printer_refuse_stagings_they_cannot_honour():
    p = for_device(_product(64, (Y,), _own), GPU)
    nest = p.body[-1]
    staging = nest.staging
    wrong = dataclasses.replace(staging, pieces=(Piece(0, 32, staging.pieces[0].region),))
    with pytest.raises(GraphError, match="not the rectangles its store writes"):
        verify_program(dataclasses.replace(p, body=p.body[:-1] + (dataclasses.replace(nest, staging=wrong),)), CUDA_SM90A)
    inner = dataclasses.replace(nest.body[0], staging=staging)  # on the nest's inner loop: no nest head
    moved = dataclasses.replace(nest, staging=None, body=(inner,))
    with pytest.raises(GraphError, match="no nest of two loops"):
        verify_program(dataclasses.replace(p, body=p.body[:-1] + (moved,)), CUDA_SM90A)
    with pytest.raises(GraphError, match="on a device without blocks"):
        verify_program(p, CPU)
    one = Loop(I, 64, LoopKind.PARALLEL, (Store(Buffer("v", F32, (64,), Scope.GLOBAL), (I,), Load(p.allocs[2], (I, I))),),
               staging=staging)
    with pytest.raises(CompileError, match="no nest of two loops"):
        _emit(dataclasses.replace(p, body=p.body[:-1] + (one,)))
    assert "  # staged: 1 piece, rows padded by 4" in format_program(p)
