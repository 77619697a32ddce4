"""Thread fitting and register placement (tile_ir/passes/): on a device with blocks, a
program's threads are narrowed until they split every parallel nest evenly; the program and
its schedule record say the narrowed count, ``fitted_from`` what was asked, ``registers``
which fragment tiles the block holds in registers; the verifier refuses a block that does
not split its nests, and the CUDA printer prints the program's threads and placement as
they are. The CPU (no blocks) takes programs as lowered."""
import dataclasses
import re

import pytest

import models
from tilefuse.codegen.cuda.emit import emit_tilelang
from tilefuse.errors import CompileError, GraphError
from tilefuse.frontend import import_onnx
from tilefuse.ir.dtypes import DType
from tilefuse.partition import partition_graph
from tilefuse.target import CPU, CUDA_SM90A
from tilefuse.tile_ir import format_program, lower_group, verify_program
from tilefuse.tile_ir.ir import Buffer, Fill, Gemm, Load, Loop, LoopKind, Scope, Store, TileProgram, Var, const_index
from tilefuse.tile_ir.nests import uneven_nests
from tilefuse.tile_ir.passes import fit_threads, for_device

F16, F32 = DType.FLOAT16, DType.FLOAT32


def _product(cols: int, threads: int = 128) -> TileProgram:
    """A 64 x 64 half-float product on tensor cores whose epilogue writes ``cols`` of its
    64 columns: the accumulator is a register tile, the epilogue nest 64 x ``cols``."""
    a, b = Buffer("a", F16, (64, 64), Scope.GLOBAL), Buffer("b", F16, (64, 64), Scope.GLOBAL)
    y = Buffer("y", F32, (64, cols), Scope.GLOBAL)
    sa, sb = Buffer("sa", F16, (64, 64), Scope.SHARED), Buffer("sb", F16, (64, 64), Scope.SHARED)
    acc = Buffer("acc", F32, (64, 64), Scope.FRAGMENT)
    i, j = Var("i"), Var("j")

    def nest(rows, width, body):
        return Loop(i, rows, LoopKind.PARALLEL, (Loop(j, width, LoopKind.PARALLEL, body),))

    body = (
        nest(64, 64, (Store(sa, (i, j), Load(a, (i, j))),)),
        nest(64, 64, (Store(sb, (i, j), Load(b, (i, j))),)),
        Fill(acc, const_index(0)),
        Gemm(sa, sb, acc),
        nest(64, cols, (Store(y, (i, j), Load(acc, (i, j))),)),
    )
    bx = Var("bx")
    return TileProgram("product", (a, b, y), 2, (1,), (bx,), threads, (sa, sb, acc), body)


def test_a_block_is_narrowed_until_it_splits_every_register_nest():
    asked = _product(63)  # 64 x 63 = 4032 epilogue iterations: no multiple of 128
    assert uneven_nests(asked.body, 128) == [4032]
    p = for_device(asked, CUDA_SM90A.device)
    assert (p.threads, p.fitted_from, p.registers) == (64, 128, frozenset({"acc"}))
    assert not uneven_nests(p.body, p.threads)
    verify_program(p, CUDA_SM90A)
    assert "threads=64) as" in format_program(p) and "fitted from 128" in format_program(p)
    text = emit_tilelang(p, CUDA_SM90A.codegen, CUDA_SM90A.device).text
    assert re.findall(r"threads=(\d+)", text) == ["64"]
    assert re.search(r"acc = T\.alloc_fragment", text) and re.search(r"sa = T\.alloc_shared", text)
    assert fit_threads(p, CUDA_SM90A.device) is p  # fitted once


def test_a_block_that_splits_its_nests_is_kept():
    p = for_device(_product(64), CUDA_SM90A.device)
    assert (p.threads, p.fitted_from, p.registers) == (128, 0, frozenset({"acc"}))


def test_an_unfitted_block_is_refused_by_the_verifier_and_the_printer():
    asked = dataclasses.replace(_product(63), registers=frozenset({"acc"}))
    with pytest.raises(GraphError, match="do not split its parallel nests"):
        verify_program(asked, CUDA_SM90A)
    with pytest.raises(CompileError, match="split its parallel nests"):
        emit_tilelang(asked, CUDA_SM90A.codegen, CUDA_SM90A.device)
    with pytest.raises(GraphError, match="are not fragment tiles"):
        verify_program(dataclasses.replace(for_device(_product(64), CUDA_SM90A.device), registers=frozenset({"sa"})),
                       CUDA_SM90A)
    too_many = dataclasses.replace(_product(64), threads=2048)
    with pytest.raises(GraphError, match="threads per block, the device allows 1 to 1024"):
        verify_program(too_many, CUDA_SM90A)


def test_the_cpu_takes_programs_as_lowered():
    p = for_device(_product(63), CPU.device)
    assert (p.threads, p.fitted_from, p.registers) == (128, 0, frozenset())


def test_zoo_kernels_are_narrowed_where_their_nests_need_it(zoo_cache):
    """ResNet's stem convolution (an im2col tile of 3 x 7 x 7 taps per 32 positions) runs
    on 8 of the 128 threads it asks for, which divide its nests."""
    graph = import_onnx(models.build("resnet", "tiny", "float32", cache_dir=zoo_cache), models.ZOO["resnet"].shapes("tiny"))
    group = next(g for g in partition_graph(graph, CUDA_SM90A).groups if g.name == "k0_conv")
    p = lower_group(group, CUDA_SM90A).program
    assert (p.threads, p.fitted_from) == (8, 128)


def test_products_and_reductions_carry_the_form_placement_chose():
    """The product is marked for tensor cores and the printer prints T.gemm for it; the same
    product unmarked prints FMA loops (the printer reads the mark, it does not decide); a
    mark its block cannot honour is refused."""
    p = for_device(_product(64), CUDA_SM90A.device)
    (gemm,) = [s for s in p.body if isinstance(s, Gemm)]
    assert gemm.tensor_cores
    assert "T.gemm(sa, sb, acc" in emit_tilelang(p, CUDA_SM90A.codegen, CUDA_SM90A.device).text
    fma = dataclasses.replace(p, body=tuple(dataclasses.replace(s, tensor_cores=False) if s is gemm else s for s in p.body))
    text = emit_tilelang(fma, CUDA_SM90A.codegen, CUDA_SM90A.device).text
    assert "T.gemm(" not in text and re.search(r"acc\[_t\d+, _t\d+\] = acc\[_t\d+, _t\d+\] \+", text)
    one_warp = dataclasses.replace(p, threads=16, schedule=None)  # no whole warp: no tensor cores
    with pytest.raises(GraphError, match="cannot run on tensor cores on 16 threads"):
        verify_program(one_warp, CUDA_SM90A)
