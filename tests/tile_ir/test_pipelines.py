"""Pipelines and residency (tile_ir/passes/pipelines.py): on a device with blocks, a
kernel's pipelined loops load through TMA where they hold only bulk copies and products and
the schedule (a producer) or the options ask for it; the blocks a core keeps resident, and a
producer-loaded kernel's register budgets, are the program's. The verifier refuses TMA of
loops that do not allow it and budgets the device does not have; the CUDA printer prints
what the program says."""
import dataclasses

import pytest

from tilefuse.codegen.cuda.emit import emit_tilelang
from tilefuse.errors import GraphError
from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ScalarFn
from tilefuse.target import CPU, CUDA_SM90A
from tilefuse.tile_ir import verify_program
from tilefuse.tile_ir.ir import (Buffer, Call, Fill, Gemm, IOp, Load, Loop, LoopKind, Residency, Scope, Store,
                                 TileProgram, Var, const_index, iop)
from tilefuse.tile_ir.passes import DeviceOptions, for_device

F16, F32 = DType.FLOAT16, DType.FLOAT32
GPU = CUDA_SM90A.device
NO_TMA = "PASS_CONFIG = {'tl.disable_tma_lower': True, 'tl.disable_warp_specialized': True}"


def _product(producer: bool = False, cast: bool = False, occupancy: int = 0) -> TileProgram:
    """A 64 x 64 x 256 half-float product over a 4-step pipelined K loop (3 stages), 128
    threads; ``cast``: the A operand is read as float32 and converted on its way (an
    element nest, no bulk copy)."""
    a = Buffer("a", F32 if cast else F16, (64, 256), Scope.GLOBAL)
    b, y = Buffer("b", F16, (256, 64), Scope.GLOBAL), Buffer("y", F32, (64, 64), Scope.GLOBAL)
    sa, sb = Buffer("sa", F16, (64, 64), Scope.SHARED), Buffer("sb", F16, (64, 64), Scope.SHARED)
    acc = Buffer("acc", F32, (64, 64), Scope.FRAGMENT)
    i, j, k = Var("i"), Var("j"), Var("k")

    def nest(store):
        return Loop(i, 64, LoopKind.PARALLEL, (Loop(j, 64, LoopKind.PARALLEL, (store,)),))

    at = Load(a, (i, iop(IOp.ADD, iop(IOp.MUL, k, 64), j)))
    step = (nest(Store(sa, (i, j), Call(ScalarFn.CAST, (at,), F16) if cast else at)),
            nest(Store(sb, (i, j), Load(b, (iop(IOp.ADD, iop(IOp.MUL, k, 64), i), j)))),
            Gemm(sa, sb, acc))
    body = (Fill(acc, const_index(0)), Loop(k, 4, LoopKind.PIPELINED, step, stages=3),
            nest(Store(y, (i, j), Load(acc, (i, j)))))
    return TileProgram("product", (a, b, y), 2, (1,), (Var("bx"),), 128, (sa, sb, acc), body,
                       occupancy=occupancy, producer=producer)


def _emit(p: TileProgram) -> str:
    return emit_tilelang(p, CUDA_SM90A.codegen, GPU).text


def test_a_producer_loaded_product_takes_tma():
    p = for_device(_product(producer=True), GPU)
    assert p.tma and p.residency == Residency()
    verify_program(p, CUDA_SM90A)
    text = _emit(p)
    assert "PASS_CONFIG = {}" in text and "annotate_min_blocks_per_sm" not in text


def test_a_cp_async_product_keeps_two_blocks_a_core():
    p = for_device(_product(), GPU)
    assert not p.tma and p.residency == Residency(2)
    text = _emit(p)
    assert NO_TMA in text and "T.annotate_min_blocks_per_sm(2)" in text
    assert for_device(_product(), GPU, DeviceOptions(tma_pipelines=True)).tma  # the option asks it of every kernel
    assert for_device(_product(), GPU, DeviceOptions(min_blocks_per_sm=1)).residency == Residency()


def test_an_operand_converted_on_its_way_keeps_cp_async():
    p = for_device(_product(producer=True, cast=True), GPU)
    assert not p.tma and NO_TMA in _emit(p)


def test_several_producer_blocks_get_register_budgets_that_fit():
    """Two blocks of 128 consumers beside a producer warpgroup of 24 registers: (65536 / 2 -
    128 x 24) / 128 = 232 registers a consumer thread."""
    p = for_device(_product(producer=True), GPU, DeviceOptions(producer_blocks_per_sm=2))
    assert p.residency == Residency(2, 24, 232)
    verify_program(p, CUDA_SM90A)
    text = _emit(p)
    assert ("T.annotate_min_blocks_per_sm(2)\n        T.annotate_producer_reg_dealloc(24)\n"
            "        T.annotate_consumer_reg_alloc(232)") in text


def test_the_schedules_occupancy_comes_first_and_the_cpu_takes_programs_as_lowered():
    assert for_device(_product(occupancy=6), GPU).residency == Residency(6)
    p = _product(producer=True)
    assert for_device(p, CPU.device) == p


def test_the_verifier_refuses_what_the_printer_cannot_honour():
    cast = dataclasses.replace(for_device(_product(producer=True, cast=True), GPU), tma=True)
    with pytest.raises(GraphError, match="TMA pipelines, but a pipelined loop holds more"):
        verify_program(cast, CUDA_SM90A)
    p = for_device(_product(producer=True), GPU)
    with pytest.raises(GraphError, match="take 69632 registers, the device has 65536"):
        verify_program(dataclasses.replace(p, residency=Residency(2, 24, 248)), CUDA_SM90A)
    with pytest.raises(GraphError, match="for a producer-loaded kernel, both budgets"):
        verify_program(dataclasses.replace(for_device(_product(), GPU), residency=Residency(2, 24, 232)), CUDA_SM90A)
    with pytest.raises(GraphError, match="is not blocks"):
        verify_program(dataclasses.replace(p, residency=Residency(0)), CUDA_SM90A)
