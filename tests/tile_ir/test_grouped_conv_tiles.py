"""Grouped convolutions as implicit GEMMs (tile_ir/lower/gemm_epilogue.py, conv_rows.py):
the programs of the CPU and of cuda:sm_90a, run by the tile interpreter on fresh random
inputs, against the reference executor and onnxruntime. Each column tile lies inside one
group and reads that group's input channels; on the GPU the kernels are grids of whole
blocks (no longer the staged schedule's one thread), half-float ones included."""
import math
import random

import numpy as np
import onnxruntime as ort
import pytest

from tests.compiler import grouped_convs
from tests.tile_ir.interpreted import mismatches
from tilefuse.frontend import import_onnx
from tilefuse.ir.prims import Conv
from tilefuse.partition import partition_graph
from tilefuse.reference import evaluate_all
from tilefuse.target import CPU, CUDA_SM90A
from tilefuse.tile_ir import lower_group
from tilefuse.tile_ir.ir import Gemm, statements
from tilefuse.tile_ir.passes.placement import tensor_core

NAMES = list(grouped_convs.CASES)
HALF = ["g2_cin16", "g4_stride2_pads_asym", "g32_resnext", "g16_regnet", "g4_1d_stride2_long"]


def _lowered(graph, target):
    """(conv node, lowered group) for each kernel of the partition."""
    for group in partition_graph(graph, target).groups:
        (conv,) = [n for n in group.nodes if isinstance(n.op, Conv)]
        yield conv, lower_group(group, target)


def _check(target, dtype, names):
    seed = random.randrange(2**31)
    model = grouped_convs.model(names, seed, dtype)
    x = grouped_convs.feeds(names, seed + 1, dtype)
    graph = import_onnx(model)
    values = evaluate_all(graph, x)
    want = {}
    if dtype is np.float32:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        want = dict(zip([f"y_{n}" for n in names], session.run(None, x)))
    bad, programs = [], []
    for conv, low in _lowered(graph, target):
        s, p = low.program.schedule, low.program
        groups, cols = conv.op.groups, conv.outputs[0].type.shape[1] // conv.op.groups
        assert s.family == "gemm" and s.groups == groups and not s.depthwise, (conv.name, s)
        assert cols % s.tile_n == 0 and p.grid[-1] == groups * cols // s.tile_n, (conv.name, p.notes)
        programs.append((conv, p))
        bad += mismatches(low, values, want)
    assert len(programs) == len(names)
    assert not bad, f"{target.name} {np.dtype(dtype).name} seed={seed}:\n" + "\n".join(bad)
    return programs


@pytest.mark.parametrize("target", [CPU, CUDA_SM90A], ids=["cpu", "cuda"])
def test_grouped_convolutions_interpret_like_the_reference_and_onnxruntime(target):
    programs = _check(target, np.float32, NAMES)
    if target is CUDA_SM90A:  # whole 128-thread blocks over a grid of tiles, not one thread
        for conv, p in programs:
            assert p.threads == 128 and math.prod(p.grid) >= conv.op.groups, (conv.name, p.threads, p.notes)


def test_half_grouped_convolutions_on_the_gpu():
    """Half-float operand tiles: a group of 16 output channels takes tensor cores, its K
    tile of 8 channels x 9 taps padded with zero columns to the MMA's k16 (as a stem's is);
    narrower groups run FMA loops, 8 columns on 32-row tiles (TileLang's wgmma refused
    64 x 8); every block keeps its 128 threads."""
    programs = {c.inputs[0].name: p for c, p in _check(CUDA_SM90A, np.float16, HALF)}
    for p in programs.values():
        assert p.threads == 128, p.notes
    regnet = programs["x_g16_regnet"]
    (gemm,) = [s for s in statements(regnet.body) if isinstance(s, Gemm)]
    s = regnet.schedule
    assert tensor_core(gemm, regnet.threads) and s.tile_k % 16 == 0, regnet.notes
    assert s.channels_per_k_tile * 9 < s.tile_k  # zero columns to the k16
