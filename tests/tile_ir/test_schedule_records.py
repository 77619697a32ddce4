"""Schedule records (tile_ir/schedule.py): every lowered program carries what its lowering
chose; the printer shows it above the program; the emitters never print it, so a kernel's
source (and its name, which hashes the source) is the same with or without it."""
import dataclasses
import json

import pytest

from tilefuse.compiler import compile_graph
from tilefuse.errors import GraphError
from tilefuse.target import CPU, CUDA_SM90A
from tilefuse.partition import partition_graph
from tilefuse.tile_ir import format_program, lower_group, verify_program
from tilefuse.tile_ir.schedule import FAMILIES, GemmSchedule, Sym

from tests.plan.handmade import mlp_graph


def _lowered(target):
    """The mlp's kernels as lowered for ``target`` (each verified by lower_group)."""
    return [low for low in compile_graph(mlp_graph(8, 16, 32), CPU).lowered.values()] if target is CPU else \
        [lower_group(g, target) for g in partition_graph(mlp_graph(8, 16, 32), target).groups if str(g.kind) != "opaque"]


def _programs(target):
    return [low.program for low in _lowered(target)]


def test_the_printer_shows_the_schedule_on_one_line_above_the_program():
    for p in _programs(CPU):
        first, second = format_program(p).splitlines()[:2]
        assert isinstance(p.schedule, GemmSchedule)
        assert first.startswith("# schedule gemm: ") and f" tile_m={p.schedule.tile_m} " in first
        assert f" threads={p.threads} " in first and second.startswith("@T.prim_func")
    bare = dataclasses.replace(p, schedule=None)
    assert format_program(bare).splitlines()[0].startswith("@T.prim_func")


@pytest.mark.parametrize("target", [CPU, CUDA_SM90A], ids=lambda t: t.name)
def test_emitted_kernels_do_not_depend_on_the_record(target):
    if target is CPU:
        from tilefuse.codegen.cpu.emit import emit_program

        def emit(p):
            src = emit_program(p, target.codegen)
            return src.symbol, src.text
    else:
        from tilefuse.codegen.cuda.emit import emit_tilelang

        def emit(p):
            src = emit_tilelang(p, target.codegen, target.device)
            return src.func, src.text
    for low in _lowered(target):
        p = low.program
        assert p.schedule is not None
        assert emit(p) == emit(dataclasses.replace(p, schedule=None))
        assert "schedule" not in emit(p)[1]


def test_a_record_that_disagrees_with_its_program_is_refused():
    (low, *_) = _lowered(CPU)
    p = low.program
    verify_program(p, CPU)
    wrong = dataclasses.replace(p, schedule=dataclasses.replace(p.schedule, threads=p.threads * 2))
    with pytest.raises(GraphError, match="gemm schedule records threads="):
        verify_program(wrong, CPU)
    wrong = dataclasses.replace(p, schedule=dataclasses.replace(p.schedule, producer=not p.producer))
    with pytest.raises(GraphError, match="records producer="):
        verify_program(wrong, CPU)


def test_records_are_json_of_scalars_and_lists():
    for p in _programs(CPU):
        data = p.schedule.to_json()
        assert data["family"] == "gemm" and data["accumulator"] == "float32"
        assert json.loads(json.dumps(data)) == data
        assert set(data) == {"family", *(f.name for f in dataclasses.fields(p.schedule))}
    assert set(FAMILIES) == {"attention", "gemm", "rows", "windows", "scatter", "staged"}


def test_a_symbol_has_a_range():
    s = Sym("seq", 1, 2048)
    assert str(s) == "seq[1..2048]"
    with pytest.raises(ValueError, match="empty"):
        Sym("seq", 8, 4)
