"""Convolution tiles at their edges (tile_ir/lower/conv_rows.py, gemm_epilogue.py), run by
the tile interpreter against the reference executor: the per-tap bounds of 1-D position
tiles that start past position 0, and the partial last column tile of the GPU's
positions-as-rows convolutions."""
import dataclasses

import numpy as np
import pytest

from tilefuse.compare import compare_output
from tilefuse.ir import Builder, DType, TensorType
from tilefuse.ir.prims import Conv
from tilefuse.partition import partition_graph
from tilefuse.reference import evaluate_all
from tilefuse.target import CPU, CUDA_SM90A, adjust
from tilefuse.tile_ir import lower_group
from tilefuse.tile_ir.ir import If, statements

from tests.tile_ir.interpreted import interpret


def _conv_graph(x_shape, w_shape, op: Conv):
    rng = np.random.default_rng(0)
    b = Builder("conv")
    x = b.input("x", TensorType(DType.FLOAT32, x_shape))
    w = b.const((rng.standard_normal(w_shape) * 0.5).astype(np.float32))
    b.output("y", b.emit1(op, x, w))
    return b.graph


def _check(graph, target, x_shape):
    values = evaluate_all(graph, {"x": np.random.default_rng(1).standard_normal(x_shape).astype(np.float32)})
    (group,) = partition_graph(graph, target).groups
    low = lower_group(group, target)
    for v, got in interpret(low, values):
        c = compare_output(v.name, got, values[id(v)])
        assert c.ok, f"{target.name} ({low.program.notes[0]}): {c.problem}"
    return low.program


# the CPU's depthwise tiles of 256 positions (its default takes up to 4096: one tile here)
CPU_256 = adjust(CPU, conv__depthwise_positions=0)


# the GPU tiles plain convolutions with positions as rows (the last test), depthwise ones so
@pytest.mark.parametrize("target,depthwise", [(CPU, False), (CPU_256, True), (CUDA_SM90A, True)],
                         ids=["cpu-plain", "cpu-depthwise", "cuda-depthwise"])
def test_1d_position_tiles_bound_their_taps_from_where_they_start(target, depthwise):
    """[2, 8, 1000], kernel 3, pads 1 / 1 and 2 / 0: four 250-position tiles per image.
    The first tile's first taps and (pads 1 / 1) the last tile's last tap leave the input;
    the tiles between read every tap unchecked. Bounds computed as if every tile started
    at position 0 read past the input at each tile's last position and dropped the first
    taps of each tile's first positions."""
    for pads in ((1, 1), (2, 0)):
        groups = 8 if depthwise else 1
        op = Conv((1,), (1,), pads, groups)
        graph = _conv_graph((2, 8, 1000), (8, 8 // groups, 3), op)
        program = _check(graph, target, (2, 8, 1000))
        if target is CUDA_SM90A:
            # on the GPU every tap runs over the whole tile, each position's window checked:
            # nests of one length, which a block of 64 threads divides (runs of 249 of 250
            # positions left 2)
            assert not any(isinstance(s, If) for s in statements(program.body)) and program.threads >= 64, program.notes
            continue
        assert program.grid[0] == 2 * 4, program.notes
        # the tiles of an image in groups of equal bounds: the first, the middle ones, the last
        assert sum(isinstance(s, If) for s in statements(program.body)) == (3 if pads == (1, 1) else 2), pads


def test_a_partial_last_column_tile_reads_only_real_weights():
    """17 output channels on the GPU's 32-wide column tile: the weight tile's 15 lanes past
    the last channel read the last channel's weights (and recompute and store its value
    again), never past the weight."""
    graph = _conv_graph((1, 8, 9, 15), (17, 8, 3, 3), Conv((1, 1), (1, 1), (1, 1, 1, 1), 1))
    program = _check(graph, CUDA_SM90A, (1, 8, 9, 15))
    assert "last column tile 17 wide" in program.notes[0]


def _im2col_nest(program):
    """The loops of the nest that fills the im2col tile (the one storing into a_tile)."""
    from tilefuse.tile_ir.ir import Loop, Store

    for s in statements(program.body):
        if isinstance(s, Loop):
            loops, body = [s], s.body
            while len(body) == 1 and isinstance(body[0], Loop):
                loops.append(body[0])
                body = body[0].body
            if any(isinstance(b, Store) and b.buffer.name == "a_tile" for b in body):
                return loops, next(b for b in body if isinstance(b, Store))
    raise AssertionError("no im2col fill")


@pytest.mark.parametrize("strides,pads", [((1, 1), (1, 1, 1, 1)), ((2, 2), (3, 3, 3, 3))], ids=["3x3", "strided-7x7"])
def test_gpu_im2col_tiles_fill_along_positions(strides, pads):
    """On the GPU the im2col tile's innermost fill loop runs over positions (the tile's
    rows), so neighbouring threads read neighbouring input positions of one channel and tap
    (taps innermost read 32 places per warp load: ResNet-50's 3 x 3 convolutions ran 1.7x
    slower); the record says so, the values stay right, and the CPU keeps its own order."""
    taps = 3 if strides == (1, 1) else 7
    graph = _conv_graph((2, 8, 15, 15), (24, 8, taps, taps), Conv(strides, (1, 1), pads, 1))
    program = _check(graph, CUDA_SM90A, (2, 8, 15, 15))
    loops, store = _im2col_nest(program)
    rows = program.schedule.tile_m
    assert program.schedule.positions_inner and loops[-1].extent == rows
    assert store.indices[0] == loops[-1].var  # the innermost loop is the tile's row index
    cpu_target = dataclasses.replace(CPU, conv=dataclasses.replace(CPU.conv, channel_rows=False))
    cpu = _check(graph, cpu_target, (2, 8, 15, 15))
    loops, store = _im2col_nest(cpu)
    assert not cpu.schedule.positions_inner and store.indices[0] == loops[0].var


@pytest.mark.parametrize("cin,taps,stride", [(3, 7, 2), (3, 3, 1), (5, 1, 1)], ids=["stem-7x7", "rgb-3x3", "5-channels-1x1"])
def test_gpu_half_convolutions_of_few_channels_pad_the_k_tile_to_the_mma(cin, taps, stride):
    """A K step of whole channels that is not a multiple of 16 (a stem's 3 x 7 x 7 = 147, one
    channel a step: 49) is padded with zero columns to the MMA's k16, so the product runs on
    tensor cores instead of as an FMA loop over shared memory (ResNet-50's stem took 2.1 of
    10.1 ms at batch 32); the packed weight carries the zero rows; the values stay right."""
    from tilefuse.tile_ir.passes.placement import tensor_core
    from tilefuse.tile_ir.ir import Gemm

    rng = np.random.default_rng(0)
    b = Builder("conv16")
    x_shape = (2, cin, 19, 19)
    x = b.input("x", TensorType(DType.FLOAT16, x_shape))
    w = b.const((rng.standard_normal((24, cin, taps, taps)) * 0.3).astype(np.float16))
    b.output("y", b.emit1(Conv((stride, stride), (1, 1), (taps // 2,) * 4, 1), x, w))
    values = evaluate_all(b.graph, {"x": rng.standard_normal(x_shape).astype(np.float16)})
    (group,) = partition_graph(b.graph, CUDA_SM90A).groups
    low = lower_group(group, CUDA_SM90A)
    for v, got in interpret(low, values):
        c = compare_output(v.name, got, values[id(v)])
        assert c.ok, c.problem
    program = low.program
    (gemm,) = [s for s in statements(program.body) if isinstance(s, Gemm)]
    assert program.schedule.tile_k % 16 == 0 and tensor_core(gemm, program.threads), program.notes
    step = cin * taps * taps if cin * taps * taps <= program.schedule.tile_k else taps * taps
    assert program.schedule.channels_per_k_tile * taps * taps == step < program.schedule.tile_k


@pytest.mark.parametrize("x_shape, k, stride, threads", [
    ((1, 144, 56, 56), 3, 2, 128),  # MobileNetV2's stride-2 depthwise: 7 rows of 28 and 8 channels left 8 threads
    ((1, 96, 56, 56), 7, 1, 128),   # ConvNeXt's 7 x 7
    ((1, 32, 14, 14), 3, 1, 128),
    ((1, 960, 7, 7), 3, 1, 64),     # a 7 x 7 map: the power of two is in the channels alone
])
def test_gpu_depthwise_tiles_keep_their_threads(x_shape, k, stride, threads):
    """A depthwise tile's nests run over (channels, rows, width), each tap over the whole
    rows with its window checked; rows and channels are chosen so that the block keeps its
    threads (of 128) and each thread a few elements. Whole rows with the channel tile of 8
    left MobileNetV2's stride-2 layer 8 threads of 196 unrolled elements a tap (a 2.7 MB
    cubin), and taps whose runs stop short of the row (27 of 28) narrowed the rest."""
    c = x_shape[1]
    graph = _conv_graph(x_shape, (c, 1, k, k), Conv((stride, stride), (1, 1), (k // 2,) * 4, c))
    program = _check(graph, CUDA_SM90A, x_shape)
    assert program.threads >= threads, (program.threads, program.fitted_from, program.notes)
    assert program.schedule.depthwise, program.schedule


def test_a_narrow_half_float_stem_runs_its_padded_k_step_on_the_matrix_unit():
    """YOLO's stem (3 channels x 3 x 3 taps = 27, 16 output channels) in fp16: its K step
    is padded to the MMA's k16 (the packed weight carries the zero rows) for 16-column
    tiles too; it was an FMA loop over shared memory on 16 threads (an 872 KB cubin)."""
    from tilefuse.frontend.precision import precision_target, with_precision
    from tilefuse.tile_ir.ir import Gemm

    x_shape = (1, 3, 256, 256)
    graph = with_precision(_conv_graph(x_shape, (16, 3, 3, 3), Conv((2, 2), (1, 1), (1, 1, 1, 1), 1)), "fp16")
    target = precision_target(CUDA_SM90A, "fp16")
    values = evaluate_all(graph, {"x": np.random.default_rng().standard_normal(x_shape).astype(np.float32)})
    (group,) = partition_graph(graph, target).groups
    low = lower_group(group, target)
    s = low.program.schedule
    assert s.tile_k == 32 and s.tile_n == 16 and low.program.threads == 128, (s, low.program.threads)
    assert any(isinstance(g, Gemm) and g.tensor_cores for g in statements(low.program.body)), low.program.notes
    from tilefuse.compare import TOLERANCE

    for v, got in interpret(low, values):  # (float32 outputs of half-float arithmetic)
        c = compare_output(v.name, got, values[id(v)], tolerance=TOLERANCE["float16"])
        assert c.ok, c.problem
