"""Warp rows (tile_ir/passes/rows.py): a row program whose rows take whole warps of the
block gets ``row_lanes``; the verifier refuses lanes a row that the program's shape or the
device's warp do not allow, and the CUDA printer lays rows out as warps only where the
program says so."""
import dataclasses

import pytest

from tilefuse.codegen.cuda.emit import emit_tilelang
from tilefuse.errors import CompileError, GraphError
from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ReduceFn, ScalarFn
from tilefuse.target import CPU, CUDA_SM90A
from tilefuse.tile_ir import format_program, verify_program
from tilefuse.tile_ir.ir import (Buffer, Call, IOp, Load, Loop, LoopKind, ReduceTile, Scope, Store, TileProgram, Var,
                                 iop)
from tilefuse.tile_ir.passes import DeviceOptions, for_device, warp_rows
from tilefuse.tile_ir.passes.rows import row_plan
from tilefuse.tile_ir.schedule import RowsSchedule

F32, F64, I32 = DType.FLOAT32, DType.FLOAT64, DType.INT32
GPU = CUDA_SM90A.device


def _rows(br: int = 8, width: int = 128, threads: int = 256, fn: ReduceFn = ReduceFn.MAX,
          dtype: DType = F32) -> TileProgram:
    """``y = x - max(x)`` per row of a (64, width) input, in tiles of ``br`` rows: the fill,
    its reduction into a row buffer, the output nest reading the row's value."""
    x = Buffer("x", dtype, (64, width), Scope.GLOBAL)
    y = Buffer("y", dtype, (64, width), Scope.GLOBAL)
    tile, row = Buffer("tile", dtype, (br, width), Scope.FRAGMENT), Buffer("row", dtype, (br,), Scope.FRAGMENT)
    bx, i, j = Var("bx"), Var("i"), Var("j")
    at = (iop(IOp.ADD, iop(IOp.MUL, bx, br), i), j)

    def nest(store):
        return Loop(i, br, LoopKind.PARALLEL, (Loop(j, width, LoopKind.PARALLEL, (store,)),))

    body = (nest(Store(tile, (i, j), Load(x, at))),
            ReduceTile(tile, row, fn, 1),
            nest(Store(y, at, Call(ScalarFn.SUB, (Load(x, at), Load(row, (i,))), dtype))))
    # a row program's record: copy raising leaves its fills as element nests
    record = RowsSchedule(64, width, br, threads, 1, threads // br, 0)
    return TileProgram("rows", (x, y), 1, (64 // br,), (bx,), threads, (row, tile), body, schedule=record)


def _emit(p: TileProgram) -> str:
    return emit_tilelang(p, CUDA_SM90A.codegen, GPU).text


def test_rows_of_whole_warps_are_laid_out_as_warps():
    p = for_device(_rows(), GPU)
    assert p.row_lanes == 32  # 256 threads, 8 rows
    verify_program(p, CUDA_SM90A)
    assert "# 32 lanes a row" in format_program(p)
    text = _emit(p)
    assert "_lane = _tx % 32" in text and "T.warp_reduce_max(" in text and "T.Parallel(" not in text
    assert for_device(_rows(br=2), GPU).row_lanes == 128  # four warps a row, meeting in shared memory
    assert warp_rows(p, GPU) == p  # decided once: the same answer again


@pytest.mark.parametrize("how, program", [
    ("16 lanes a row: half a warp", _rows(threads=128)),
    ("a tail: 100 columns over 32 lanes", _rows(width=100)),
    ("a product: no warp shuffle", _rows(fn=ReduceFn.PROD)),
    ("an integer max", _rows(dtype=I32)),
])
def test_rows_that_take_no_whole_warps_keep_the_block_form(how, program):
    p = for_device(program, GPU)
    assert p.row_lanes == 0, how
    verify_program(p, CUDA_SM90A)
    assert "T.get_thread_binding" not in _emit(p)


def test_a_narrowed_block_an_option_and_the_cpu_keep_the_block_form():
    assert warp_rows(dataclasses.replace(_rows(), fitted_from=512), GPU).row_lanes == 0
    assert for_device(_rows(), GPU, DeviceOptions(warp_rows=False)).row_lanes == 0
    assert for_device(_rows(), CPU.device).row_lanes == 0
    assert for_device(_rows(dtype=F64), GPU).row_lanes == 32


def test_the_verifier_and_the_printer_refuse_lanes_the_program_does_not_allow():
    p = for_device(_rows(), GPU)
    stale = dataclasses.replace(p, threads=128, schedule=p.schedule.with_threads(128))  # 32 lanes a row: 256 threads
    with pytest.raises(GraphError, match="no row program"):
        verify_program(stale, CUDA_SM90A)
    with pytest.raises(CompileError, match="no row program of whole warps"):
        _emit(stale)
    half = dataclasses.replace(for_device(_rows(threads=128), GPU), row_lanes=16)
    assert row_plan(half, 16) is not None  # the shape holds, but 16 lanes are no whole warp
    with pytest.raises(GraphError, match="not whole warps of 32"):
        verify_program(half, CUDA_SM90A)
    wide = for_device(_rows(width=96), GPU)  # a (8, 96) tile: no register reduction, lanes would be its own
    assert wide.row_lanes == 32
    fill, red, out = wide.body
    shared = dataclasses.replace(wide, body=(fill, dataclasses.replace(red, lanes=4), out))
    with pytest.raises(GraphError, match="lanes of their own"):
        verify_program(shared, CUDA_SM90A)
