"""Depthwise convolutions' CPU programs (tile_ir/lower/conv_rows.py) run by the tile
interpreter on fresh random inputs, against the reference executor and onnxruntime: from
zero-padded input rows on chip, split by stride phase (every tap summed along them in whole
vectors); for rows under 32 wide, with 16 channels in vector lanes; strided ones over wider
rows summed over the input planes where they lie."""
import random

import onnxruntime as ort

from tests.compiler import depthwise_convs
from tests.tile_ir.interpreted import mismatches
from tilefuse.frontend import import_onnx
from tilefuse.ir.prims import Conv
from tilefuse.partition import partition_graph
from tilefuse.reference import evaluate_all
from tilefuse.target import CPU
from tilefuse.tile_ir import lower_group

# the big maps cost the interpreter most; the compiled test runs every case
NAMES = ["k5_s1_7_1152", "k5_s1_14_b3", "k3_s1_odd13", "k5_s1_odd29_asym", "k3_s1_dilated", "k3_s1_nopad",
         "k3_s1_28_rows", "k5_s2_odd29", "k3_s2_14", "k5_s2_asym_b2", "k3_d2_asym",
         "k5_d2_lanes", "k5_lanes_tall", "k3_s3_planes"]


def test_depthwise_programs_interpret_like_the_reference_and_onnxruntime():
    seed = random.randrange(2**31)
    model = depthwise_convs.model(NAMES, seed)
    x = depthwise_convs.feeds(NAMES, seed + 1)
    graph = import_onnx(model)
    values = evaluate_all(graph, x)
    want = dict(zip([f"y_{n}" for n in NAMES],
                    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)))
    bad, seen = [], 0
    for group in partition_graph(graph, CPU).groups:
        (conv,) = [n for n in group.nodes if isinstance(n.op, Conv)]
        low = lower_group(group, CPU)
        s = low.program.schedule
        # rows under 32 wide, whole vectors of channels, strided or 5 x 5: channels in lanes; strided over
        # wider rows: the input planes; else the padded rows hold the input row and both pads, split in stride phases
        padded = conv.inputs[0].type.shape[3] + conv.op.pads[1] + conv.op.pads[3]
        name = conv.inputs[0].name.removeprefix("x_")  # (the case's input is x_<case>)
        lanes = 16 if depthwise_convs.in_lanes(name) else 0
        planes = depthwise_convs.in_planes(name)
        assert s.depthwise and s.depthwise_lanes == lanes and s.depthwise_planes == planes, (conv.name, s)
        assert s.depthwise_padded_width == (0 if lanes or planes else -(-padded // conv.op.strides[1])), (conv.name, s)
        seen += 1
        bad += mismatches(low, values, want)
    assert seen == len(NAMES)
    assert not bad, f"seed={seed}:\n" + "\n".join(bad)


def test_narrow_rows_take_the_planes_and_lanes_only_with_avx512():
    """Unstrided rows of 16 to 31 sum over the input planes where the plane helper reads
    them in place (``ConvPolicy.depthwise_planes_width``: its AVX-512 path), and a 7 x 7
    map's 3 x 3 runs in lanes with its epilogue there (``lanes_epilogue``: AVX-512's block
    transpose); built for x86-64-v3 (a ring copy, element-loop transposes: 2-8x slower)
    both keep the padded tile. 32-wide rows take the planes either way."""
    from tilefuse.target import adjust

    names = ["k3_s1_28_rows", "k3_s1_112", "k3_s1_7_lanes"]
    graph = import_onnx(depthwise_convs.model(names, 0))
    for target, avx512 in ((adjust(CPU, codegen__isa="x86-64-v3"), False), (adjust(CPU, codegen__isa="x86-64-v4"), True)):
        schedules = [lower_group(g, target).program.schedule for g in partition_graph(graph, target).groups]
        assert [s.depthwise_planes for s in schedules] == [avx512, True, False], (target.codegen, schedules)
        assert [s.depthwise_lanes for s in schedules] == [0, 0, 16 if avx512 else 0], (target.codegen, schedules)
