"""Reduction lanes (tile_ir/passes/lanes.py): on a device with blocks, a reduction the block
folds through shared memory gets the threads per kept index that divide the reduced extent
and fit in the block, written on the statement; the verifier refuses lanes the printer
cannot honour, and the CUDA printer prints the cooperative form only where the program
says so. The CPU takes programs as lowered."""
import dataclasses
import re

import pytest

from tilefuse.codegen.cuda.emit import emit_tilelang
from tilefuse.codegen.options import CpuOptions, CudaOptions
from tilefuse.errors import CompileError, GraphError
from tilefuse.ir.dtypes import DType
from tilefuse.ir.prims import ReduceFn, ScalarFn
from tilefuse.target import CPU, CUDA_SM90A
from tilefuse.tile_ir import format_program, verify_program
from tilefuse.tile_ir.ir import Buffer, Call, Const, Load, Loop, LoopKind, ReduceTile, Scope, Store, TileProgram, Var, statements
from tilefuse.tile_ir.passes import DeviceOptions, assign_lanes, for_device
from tilefuse.tile_ir.passes.lanes import lanes_for

F32, I32 = DType.FLOAT32, DType.INT32
GPU = CUDA_SM90A.device


def _row_sums(rows: int, width: int, threads: int, fn: ScalarFn = ScalarFn.ADD, dtype: DType = F32,
              after: bool = False) -> TileProgram:
    """``s[i] = 0; for j: s[i] = fn(s[i], x[i, j])`` per row of a (rows, width) input, then
    ``y[i] = s[i]`` (optionally inside the fold's nest, after the loop)."""
    x = Buffer("x", dtype, (rows, width), Scope.GLOBAL)
    y = Buffer("y", dtype, (rows,), Scope.GLOBAL)
    s = Buffer("s", dtype, (rows,), Scope.SHARED)
    i, j = Var("i"), Var("j")
    acc = Load(s, (i,))
    update = Store(s, (i,), Call(fn, (acc, Load(x, (i, j))), dtype))
    store = Store(y, (i,), Load(s, (i,)))
    body = (Store(s, (i,), Const(0, dtype)), Loop(j, width, LoopKind.SERIAL, (update,)))
    nests = (Loop(i, rows, LoopKind.PARALLEL, body + ((store,) if after else ())),)
    if not after:
        nests += (Loop(i, rows, LoopKind.PARALLEL, (store,)),)
    return TileProgram("row_sums", (x, y), 1, (1,), (Var("bx"),), threads, (s,), nests)


def _tile_reduce(rows: int, width: int, threads: int) -> TileProgram:
    """A (rows, width) tile filled from x and reduced along its rows by a ReduceTile."""
    x = Buffer("x", F32, (rows, width), Scope.GLOBAL)
    y = Buffer("y", F32, (rows,), Scope.GLOBAL)
    tile, row = Buffer("tile", F32, (rows, width), Scope.FRAGMENT), Buffer("row", F32, (rows,), Scope.FRAGMENT)
    i, j = Var("i"), Var("j")
    body = (Loop(i, rows, LoopKind.PARALLEL, (Loop(j, width, LoopKind.PARALLEL, (Store(tile, (i, j), Load(x, (i, j))),)),)),
            ReduceTile(tile, row, ReduceFn.SUM, 1),
            Loop(i, rows, LoopKind.PARALLEL, (Store(y, (i,), Load(row, (i,))),)))
    return TileProgram("tile_reduce", (x, y), 1, (1,), (Var("bx"),), threads, (tile, row), body)


def _lanes(p: TileProgram) -> list[int]:
    """The lanes of the program's serial loops and tile reductions, in order."""
    return [s.lanes for s in statements(p.body) if isinstance(s, ReduceTile) or isinstance(s, Loop) and s.kind is LoopKind.SERIAL]


def _emit(p: TileProgram) -> str:
    return emit_tilelang(p, CUDA_SM90A.codegen, GPU).text


def test_lanes_are_the_largest_power_of_two_that_divides_and_fits():
    assert lanes_for(64, 768, 128, 32) == 2  # 64 x 4 would not fit in 128
    assert lanes_for(8, 768, 256, 32) == 32  # capped
    assert lanes_for(8, 768, 256, 4) == 4
    assert lanes_for(8, 100, 256, 32) == 4  # 100 = 4 x 25
    assert lanes_for(128, 768, 128, 32) == 1  # a thread per row already fills the block


def test_a_fold_of_few_rows_shares_its_loop_and_is_printed_cooperatively():
    p = for_device(_row_sums(16, 768, 128), GPU)
    assert _lanes(p) == [8]  # 16 rows x 8 lanes = the block
    verify_program(p, CUDA_SM90A)
    assert "T.serial(768, lanes=8)" in format_program(p)
    text = _emit(p)
    assert re.search(r"_part0 = T\.alloc_shared\(\(16, 8\), \"float32\"\)", text)
    assert re.search(r"in T\.Parallel\(16, 8\):", text) and "T.serial(96)" in text  # 768 / 8 terms a lane
    assert assign_lanes(p, GPU) == p  # decided once: the same answer again
    # the printer reads the program: the same program with one thread per row prints no partials
    one = dataclasses.replace(p, body=tuple(_with_lanes(s, 1) for s in p.body))
    verify_program(one, CUDA_SM90A)
    assert "_part" not in _emit(one) and "T.serial(768)" in _emit(one)


def test_options_bound_the_lanes():
    p = for_device(_row_sums(16, 768, 128), GPU, DeviceOptions(reduction_lanes=2))
    assert _lanes(p) == [2]
    assert DeviceOptions.of(CudaOptions()) == DeviceOptions()
    assert DeviceOptions.of(CpuOptions()) == DeviceOptions(reduction_lanes=16)  # a host's: one 16-float vector
    assert DeviceOptions.of(CudaOptions(reduction_lanes=4)).reduction_lanes == 4


@pytest.mark.parametrize("how", ["sub", "int-max", "after"])
def test_folds_lanes_cannot_share_keep_one_thread(how):
    """A subtraction is no associative fold; an integer max has no identity the printer
    gives; stores after the loop read the row's own value."""
    kw = {"sub": dict(fn=ScalarFn.SUB), "int-max": dict(fn=ScalarFn.MAX, dtype=I32), "after": dict(after=True)}[how]
    p = for_device(_row_sums(16, 768, 128, **kw), GPU)
    assert _lanes(p) == [1]
    assert "_part" not in _emit(p)


def test_tile_reductions_without_a_register_form_get_lanes():
    """A (8, 100) tile has no register layout (not a power of two): 4 lanes a row (100 =
    4 x 25); a (8, 128) one is reduced in registers by TileLang and keeps 1."""
    p = for_device(_tile_reduce(8, 100, 128), GPU)
    assert _lanes(p) == [4] and "lanes=4" in format_program(p)
    verify_program(p, CUDA_SM90A)
    assert re.search(r"_part0 = T\.alloc_shared\(\(8, 4\)", _emit(p))
    q = for_device(_tile_reduce(8, 128, 128), GPU)
    assert _lanes(q) == [1] and "T.reduce_sum(" in _emit(q)


def test_the_cpu_takes_programs_as_lowered():
    p = _row_sums(16, 768, 128)
    assert for_device(p, CPU.device) == p


def _with_lanes(s, lanes):
    """``s`` with every serial loop's and tile reduction's lanes set to ``lanes``."""
    if isinstance(s, ReduceTile):
        return dataclasses.replace(s, lanes=lanes)
    if isinstance(s, Loop):
        body = tuple(_with_lanes(x, lanes) for x in s.body)
        return dataclasses.replace(s, body=body, lanes=lanes if s.kind is LoopKind.SERIAL else s.lanes)
    return s


def test_the_verifier_refuses_lanes_the_printer_cannot_honour():
    folded = for_device(_row_sums(16, 768, 128), GPU)
    for lanes, message in ((3, "not a power of two"), (16, "fit in 128")):
        bad = dataclasses.replace(folded, body=tuple(_with_lanes(s, lanes) for s in folded.body))
        with pytest.raises(GraphError, match=message):
            verify_program(bad, CUDA_SM90A)
    with pytest.raises(GraphError, match="on a device without blocks"):
        verify_program(folded, CPU)
    # lanes on a loop that is no fold's (a subtraction): refused, and the printer refuses it too
    sub = _row_sums(16, 768, 128, fn=ScalarFn.SUB)
    bad = dataclasses.replace(sub, body=tuple(_with_lanes(s, 2) for s in sub.body))
    with pytest.raises(GraphError, match="is no fold's serial loop"):
        verify_program(bad, CUDA_SM90A)
    with pytest.raises(CompileError, match="no fold's loop"):
        _emit(bad)
    # lanes on a reduction TileLang does in registers
    reg = for_device(_tile_reduce(8, 128, 128), GPU)
    bad = dataclasses.replace(reg, body=tuple(_with_lanes(s, 2) for s in reg.body))
    with pytest.raises(GraphError, match="is a register reduction"):
        verify_program(bad, CUDA_SM90A)
    # a register form for a tile TileLang has no register layout of (8 x 100, on the 32 threads fitting left)
    odd = for_device(_tile_reduce(8, 100, 128), GPU)
    marked = dataclasses.replace(odd, body=tuple(dataclasses.replace(s, registers=True, lanes=1)
                                                 if isinstance(s, ReduceTile) else s for s in odd.body))
    with pytest.raises(GraphError, match="has no register form on 32 threads"):
        verify_program(marked, CUDA_SM90A)


# -- a host's tile reductions in vector lanes --------------------------------------------------

@pytest.mark.parametrize("width, lanes", [(208, 16), (100, 4), (8, 4), (197, 1), (6, 1)])
def test_a_hosts_row_reductions_of_a_tile_fold_in_vector_lanes(width, lanes):
    """On the CPU a float row reduction of a tile folds each row into ``lanes`` running
    values (the largest power of two up to CpuOptions.reduction_lanes dividing the row
    with two values a lane at least, and 4 at least); the verifier accepts them and the C
    printer prints them."""
    from tilefuse.codegen.cpu import emit_program

    p = for_device(_tile_reduce(8, width, 1), CPU.device, DeviceOptions.of(CpuOptions()))
    assert _lanes(p) == [lanes]
    verify_program(p, CPU)
    assert (f"_l[{lanes}]" in emit_program(p).text) == (lanes > 1)


def test_the_verifier_refuses_host_lanes_that_do_not_divide_the_row():
    p = _tile_reduce(8, 100, 1)
    bad = dataclasses.replace(p, body=tuple(_with_lanes(s, 16) for s in p.body))
    with pytest.raises(GraphError, match="vector lanes dividing the row"):
        verify_program(bad, CPU)


@pytest.mark.parametrize("fn", [ReduceFn.SUM, ReduceFn.MAX, ReduceFn.MIN])
def test_host_lanes_give_the_rows_reduction(fn, tmp_path):
    """The compiled kernel against numpy on fresh random rows (a sum in 16 lanes rounds as
    float32 does, within the dtype's tolerance; max and min exactly)."""
    import numpy as np

    from tilefuse.codegen.cpu import build_kernel
    from tilefuse.codegen.cpu.call import call_kernel

    p = _tile_reduce(8, 208, 1)
    p = dataclasses.replace(p, body=tuple(dataclasses.replace(s, fn=fn) if isinstance(s, ReduceTile) else s
                                          for s in p.body))
    p = for_device(p, CPU.device, DeviceOptions.of(CpuOptions()))
    assert _lanes(p) == [16]
    x = np.random.default_rng().standard_normal((8, 208)).astype(np.float32)
    y = np.zeros(8, np.float32)
    call_kernel(build_kernel(p, cache_dir=tmp_path), [x, y])
    want = {ReduceFn.SUM: x.sum(axis=1), ReduceFn.MAX: x.max(axis=1), ReduceFn.MIN: x.min(axis=1)}[fn]
    if fn is ReduceFn.SUM:
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(y, want)

