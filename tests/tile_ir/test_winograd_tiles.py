"""3 x 3 convolutions' CPU programs by minimal filtering (tile_ir/lower/conv_winograd.py) run
by the tile interpreter on fresh random inputs, against the reference executor and
onnxruntime: blocks of whole output rows, tiles past the map's edge, padding on any side,
images of a batch and blocks of output channels."""
import random

import onnxruntime as ort

from tests.compiler import winograd_convs
from tests.tile_ir.interpreted import mismatches
from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.reference import evaluate_all
from tilefuse.target import CPU, adjust
from tilefuse.tile_ir import lower_group
from tilefuse.tile_ir.ir import TapGemm, Winograd, statements

# the cases for minimal filtering, less the 56 x 56 one (the interpreter's slowest; the compiled test runs it)
NAMES = [n for n in winograd_convs.CASES if winograd_convs.winograd(n) and n != "r56_64"]


def test_winograd_programs_interpret_like_the_reference_and_onnxruntime():
    seed = random.randrange(2**31)
    model = winograd_convs.model(NAMES, seed)
    x = winograd_convs.feeds(NAMES, seed + 1)
    graph = import_onnx(model)
    values = evaluate_all(graph, x)
    want = dict(zip([f"y_{n}" for n in NAMES],
                    ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, x)))
    bad, seen = [], 0
    for group in partition_graph(graph, CPU).groups:
        low = lower_group(group, CPU)
        assert low.program.schedule.winograd == 4, low.program.notes
        (w,) = [s for s in statements(low.program.body) if isinstance(s, Winograd)]
        assert w.c.shape[1] == w.rows * w.width  # every position of a block's rows
        seen += 1
        bad += mismatches(low, values, want)
    assert seen == len(NAMES)
    assert not bad, f"seed={seed}:\n" + "\n".join(bad)


def test_the_policy_turns_it_off():
    """``ConvPolicy.winograd`` off: ResNet's 3 x 3 convolution on 56 x 56 maps is computed
    directly from its padded rows (``TapGemm``), its weight bound as [Cout, K] rows."""
    graph = import_onnx(winograd_convs.model(["r56_64"], 0))
    for target, minimal in ((CPU, True), (adjust(CPU, conv__winograd=False), False)):
        (group,) = partition_graph(graph, target).groups
        low = lower_group(group, target)
        body = list(statements(low.program.body))
        assert any(isinstance(s, Winograd) for s in body) == minimal
        assert any(isinstance(s, TapGemm) for s in body) != minimal
        assert low.program.schedule.winograd == (4 if minimal else 0)
        assert [p.shape for p in low.program.params][1] == ((1, 1, 36, 64, 64) if minimal else (64, 576))


def test_rows_too_wide_for_the_scratch_keep_the_direct_schedule():
    """A 3 x 3 convolution over rows 8,000 wide (2,000 tiles a row of tiles): a block's
    scratch for even 16 channels outgrows the core's cache, so it is not taken; the same
    convolution over rows 64 wide is."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng().standard_normal((16, 16, 3, 3)).astype(np.float32), "w")
    for width, minimal in ((8000, 0), (64, 4)):
        shape = [1, 16, 8, width]
        graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
                                  "rows", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], [w])
        g = import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
        (group,) = partition_graph(g, CPU).groups
        assert lower_group(group, CPU).program.schedule.winograd == minimal, width
