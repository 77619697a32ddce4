"""Thread fitting (tile_ir/passes/threads.py): on a device with blocks, a program's threads
are narrowed until they split every parallel nest over fragment tiles evenly; the program and its schedule
record say the narrowed count, ``fitted_from`` what was asked, the verifier refuses a block
that does not split its nests, and the CUDA printer prints the program's threads as they
are. The CPU (no blocks) takes programs as lowered."""
import dataclasses
import re

import pytest

import models
from tilefuse.codegen.cuda.emit import emit_tilelang
from tilefuse.errors import CompileError, GraphError
from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.target import CPU, CUDA_SM90A
from tilefuse.tile_ir import format_program, lower_group, verify_program
from tilefuse.tile_ir.nests import parallel_totals, uneven_nests
from tilefuse.tile_ir.passes import fit_threads


def _first_conv(target, zoo_cache):
    """MobileNetV2's first depthwise convolution (its accumulator tile of 8 channels x 96
    positions has no even split over 128 threads), lowered for ``target``."""
    graph = import_onnx(models.build("mobilenetv2", "tiny", "float32", cache_dir=zoo_cache),
                        models.ZOO["mobilenetv2"].shapes("tiny"))
    group = next(g for g in partition_graph(graph, target).groups if g.name == "k4_conv")
    return lower_group(group, target).program


def test_only_nests_over_fragment_tiles_narrow_a_block(zoo_cache):
    """Nests over shared and global memory split unevenly (TileLang guards the last
    threads): ResNet's stem convolution, whose im2col tile of 3 x 7 x 7 taps is no multiple
    of 128, keeps its 128 threads."""
    graph = import_onnx(models.build("resnet", "tiny", "float32", cache_dir=zoo_cache), models.ZOO["resnet"].shapes("tiny"))
    group = next(g for g in partition_graph(graph, CUDA_SM90A).groups if str(g.kind) != "opaque")
    p = lower_group(group, CUDA_SM90A).program
    assert (p.threads, p.fitted_from) == (128, 0)
    assert any(n % 128 for n in parallel_totals(p.body) if n >= 128) and not uneven_nests(p.body, 128)


def test_a_block_is_narrowed_until_it_splits_every_nest(zoo_cache):
    p = _first_conv(CUDA_SM90A, zoo_cache)
    assert p.fitted_from > p.threads >= 1 and p.fitted_from % p.threads == 0
    assert not uneven_nests(p.body, p.threads)
    assert uneven_nests(p.body, p.threads * 2)  # the widest block that splits them
    assert p.schedule is not None and p.schedule.threads == p.threads
    assert f"threads={p.threads}) as" in format_program(p) and f"fitted from {p.fitted_from}" in format_program(p)
    text = emit_tilelang(p, CUDA_SM90A.codegen, CUDA_SM90A.device).text
    assert re.findall(r"threads=(\d+)", text) == [str(p.threads)]
    assert fit_threads(p, CUDA_SM90A.device) is p  # fitted once


def test_the_cpu_takes_programs_as_lowered(zoo_cache):
    p = _first_conv(CPU, zoo_cache)
    assert p.fitted_from == 0
    assert fit_threads(dataclasses.replace(p, threads=128), CPU.device).threads == 128


def test_an_unfitted_block_is_refused_by_the_verifier_and_the_printer(zoo_cache):
    p = _first_conv(CUDA_SM90A, zoo_cache)
    asked = dataclasses.replace(p, threads=p.fitted_from, fitted_from=0,
                                schedule=dataclasses.replace(p.schedule, threads=p.fitted_from))
    with pytest.raises(GraphError, match="do not split its parallel nests"):
        verify_program(asked, CUDA_SM90A)
    with pytest.raises(CompileError, match="split its parallel nests"):
        emit_tilelang(asked, CUDA_SM90A.codegen, CUDA_SM90A.device)
    refitted = fit_threads(asked, CUDA_SM90A.device)
    assert (refitted.threads, refitted.fitted_from, refitted.schedule.threads) == (p.threads, p.fitted_from, p.threads)
    verify_program(refitted, CUDA_SM90A)
    too_many = dataclasses.replace(p, threads=2048, schedule=dataclasses.replace(p.schedule, threads=2048))
    with pytest.raises(GraphError, match="threads per block, the device allows 1 to 1024"):
        verify_program(too_many, CUDA_SM90A)
