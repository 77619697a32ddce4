"""Convolutions at the tile edges of their schedules against onnxruntime and the reference
executor: 1-D and 2-D, every kind of padding (none, symmetric, one-sided either way, wider
than the kernel, auto_pad SAME_UPPER / SAME_LOWER / VALID), strides and dilations 1 to 3,
groups 1, 2, depthwise and depthwise with two outputs per channel, output sizes just below,
at and above each tile size and twice it plus one (``conv_grid``), channel counts that
are not multiples of the vector width.

Each case runs through the CPU pipeline (compile, plan, run) and, lowered for the
cuda:sm_90a target (its own tile sizes, grid and partial tiles), through the tile
interpreter, which refuses a load outside its buffer. The default grid takes each
padding x grouping pair with a few sizes, strides and dilations in turn; ``-m slow``
runs the full product of sizes and stride/dilation pairs as well.
"""
import math

import numpy as np
import onnxruntime as ort
import pytest

import tilefuse
from tilefuse.errors import GraphError
from tests.compiler import conv_grid
from tilefuse.compare import compare_output
from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.reference import evaluate_all, run_graph
from tilefuse.target import CPU, CUDA_SM90A
from tilefuse.tile_ir import lower_group
from tilefuse.tile_ir.interpret import run_program
from tilefuse.tile_ir.ir import If, statements

FAST = {**conv_grid.batches(1, full=False, per_model=32), **conv_grid.batches(2, full=False, per_model=32)}
FULL = {**conv_grid.batches(1, full=True, per_model=64), **conv_grid.batches(2, full=True, per_model=64)}


@pytest.fixture
def full_grid(request):
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("the full grid runs with -m slow")


def _want(cases, seed, x):
    """onnxruntime's outputs (SAME with dilations given as its explicit pads)."""
    session = ort.InferenceSession(conv_grid.model(cases, seed, for_reference=True).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, x)


def _check_cpu(cases, seed):
    m = conv_grid.model(cases, seed)
    x = conv_grid.feeds(cases, seed + 1)
    want = _want(cases, seed, x)
    graph = import_onnx(m, {k: v.shape for k, v in x.items()})
    ref = list(run_graph(graph, x).values())
    got = tilefuse.InferenceSession(tilefuse.compile(m, target="cpu")).run(None, x)
    bad = []
    for c, g, w, r in zip(cases, got, want, ref):
        for what, expected in (("onnxruntime", w), ("reference", r)):
            cmp = compare_output("y", g, expected)
            if not cmp.ok:
                bad.append(f"{c.name} against {what}: {cmp.problem}")
    assert not bad, f"{len(bad)} of {len(cases)} convolutions wrong on the CPU:\n" + "\n".join(bad)


def _check_cuda_lowering(cases, seed):
    m = conv_grid.model(cases, seed)
    x = conv_grid.feeds(cases, seed + 1)
    want = dict(zip((f"y{i}" for i in range(len(cases))), _want(cases, seed, x)))
    graph = import_onnx(m, {k: v.shape for k, v in x.items()})
    values = evaluate_all(graph, x)
    bad = []
    for group in partition_graph(graph, CUDA_SM90A).groups:
        if str(group.kind) == "opaque":
            continue
        try:
            low = lower_group(group, CUDA_SM90A)
        except GraphError as e:  # a grouped convolution's staged output beyond a block's shared memory
            assert "no schedule for" in str(e), e
            continue
        n_in = low.program.num_inputs
        args = [np.ascontiguousarray(v.data if v.is_constant else values[id(v)]) for v in low.bindings[:n_in]]
        outs = [np.zeros(v.type.shape, v.type.dtype.numpy) for v in low.bindings[n_in:]]
        where = f"{group.name} ({low.program.notes[0]})"
        try:
            run_program(low.program, args + outs)
        except Exception as e:  # an index outside a buffer: the lowering is wrong
            bad.append(f"{where}: {e}")
            continue
        for v, got in zip(low.bindings[n_in:], outs):
            expected = want.get(v.name, values[id(v)])
            c = cases[int(v.name[1:])] if v.name in want else None
            cmp = compare_output(v.name, got, expected)
            if not cmp.ok:
                bad.append(f"{c.name if c else v.name} in {where}: {cmp.problem}")
    assert not bad, f"{len(bad)} kernels wrong for {CUDA_SM90A.name}:\n" + "\n".join(bad)


@pytest.mark.parametrize("name", list(FAST))
def test_convolutions_at_tile_edges_match_onnxruntime_on_cpu(name):
    _check_cpu(FAST[name], seed=len(name))


@pytest.mark.parametrize("name", list(FAST))
def test_cuda_lowering_of_convolutions_at_tile_edges_interprets_like_onnxruntime(name):
    _check_cuda_lowering(FAST[name], seed=len(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FULL))
def test_full_grid_matches_onnxruntime_on_cpu(name, full_grid):
    _check_cpu(FULL[name], seed=len(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FULL))
def test_full_grid_cuda_lowering_interprets_like_onnxruntime(name, full_grid):
    _check_cuda_lowering(FULL[name], seed=len(name))


def test_the_grid_reaches_every_tile_edge():
    """The fast grid keeps covering what it is for: 1-D convolutions, plain and depthwise,
    on several position tiles per image of which those the padding reaches run their own
    per-tap bounds (branches on the tile number); and positions-as-rows tiles (under 64
    positions per image)."""
    seen = set()
    for cases in FAST.values():
        graph = import_onnx(conv_grid.model(cases, 0), {f"x{i}": c.x_shape for i, c in enumerate(cases)})
        for group in partition_graph(graph, CPU).groups:
            conv = next(n for n in group.nodes if n.op.name == "Conv")
            out, p = conv.outputs[0].type.shape, lower_group(group, CPU).program
            if not p.notes[0].startswith("gemm+epilogue"):
                continue
            depthwise = p.schedule.depthwise
            branches = sum(isinstance(s, If) for s in statements(p.body))
            if len(out) == 3 and p.grid[0] // out[0] > 1 and branches >= 2:
                seen.add(("tiles with their own runs", depthwise))
            if math.prod(out[2:]) < 64 and not depthwise:
                seen.add(("positions as rows", depthwise))
    assert seen == {("tiles with their own runs", False), ("tiles with their own runs", True),
                    ("positions as rows", False)}, seen
