"""Grouped transposed convolutions are implicit GEMMs whose column tiles lie inside one group.

They were the staged schedule's: one thread of one block on the GPU, refused where the
output did not fit on chip (64 -> 32 channels in 2 groups at 32 x 32 -> 64 x 64: "the
staged schedule needs 512 KB"). Now a tile's K runs over its group's input channels and
its columns over the group's output channels, as for grouped convolutions. Checked through
the tile interpreter (CPU and sm_90a programs, fp32 and fp16) and as CPU plans, against
onnxruntime on fresh random inputs: 1-D and 2-D, strides, dilations, padding, output
padding, two and four groups, one channel a group (depthwise).
"""
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tilefuse
from tilefuse import patterns
from tilefuse.compare import compare_output
from tilefuse.frontend import import_onnx
from tilefuse.frontend.precision import precision_target, with_precision
from tilefuse.partition import partition_graph
from tilefuse.reference import evaluate_all
from tilefuse.target import CPU, CUDA_SM90A
from tilefuse.tile_ir.lower import lower_group

from tests.tile_ir.interpreted import interpret

# name: (input shape, output channels, kernel, attrs)
CASES = {
    "2d-two-groups": ((1, 8, 6, 6), 6, (4, 4), {"group": 2, "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    "2d-four-groups-dilated": ((2, 8, 5, 7), 8, (3, 3), {"group": 4, "dilations": [2, 1], "pads": [0, 1, 2, 1]}),
    "2d-depthwise-upsample": ((1, 6, 5, 5), 6, (2, 2), {"group": 6, "strides": [2, 2]}),
    "2d-output-padding": ((1, 4, 4, 4), 6, (3, 3), {"group": 2, "strides": [2, 2], "output_padding": [1, 1]}),
    "1d-two-groups": ((2, 6, 20), 4, (5,), {"group": 2, "strides": [3], "pads": [1, 2]}),
}


def deconv_model(name: str) -> tuple[bytes, tuple[int, ...]]:
    shape, cout, kernel, attrs = CASES[name]
    groups = attrs["group"]
    rng = np.random.default_rng()
    w = rng.standard_normal((shape[1], cout // groups, *kernel)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], kernel_shape=list(kernel), **attrs)
    graph = helper.make_graph([node, ], name, [x], [y], [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model = onnx.shape_inference.infer_shapes(model)
    onnx.checker.check_model(model)
    return model.SerializeToString(), shape


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("name", list(CASES))
def test_grouped_transposed_convolutions_are_grouped_gemms(name, precision):
    model, shape = deconv_model(name)
    x = np.random.default_rng().standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(model).run(None, {"x": x})[0]
    for target in (CPU, CUDA_SM90A):
        graph = import_onnx(onnx.load_from_string(model), {})
        if precision == "fp16" and target is CPU:
            continue  # half floats are a GPU precision here
        graph, t = with_precision(graph, precision), precision_target(target, precision)
        values = evaluate_all(graph, {"x": x})
        for g in partition_graph(graph, t).groups:
            lowered = lower_group(g, t)
            if any(type(n.op).__name__ == "ConvTranspose" for n in g.nodes):
                assert isinstance(g.match, patterns.GemmMatch), g.match
                assert lowered.program.schedule.groups == CASES[name][3]["group"]
                if t.device.max_block_threads:
                    assert math.prod(lowered.program.grid) * lowered.program.threads > 1
            for v, got in interpret(lowered, values):
                values[id(v)] = got
        got = values[id(graph.outputs["y"])]
        c = compare_output("y", got.astype(np.float32), want, precision=precision)
        assert c.ok, f"{t.name}: {c.describe()}"


@pytest.mark.parametrize("name", ["2d-two-groups", "1d-two-groups"])
def test_grouped_transposed_convolutions_cpu_plan(name):
    model, shape = deconv_model(name)
    x = np.random.default_rng().standard_normal(shape).astype(np.float32)
    want = ort.InferenceSession(model).run(None, {"x": x})[0]
    got = tilefuse.InferenceSession(tilefuse.compile(model, "cpu")).run(None, {"x": x})[0]
    assert compare_output("y", got, want).ok


@pytest.mark.parametrize("name", ["2d-two-groups", "2d-depthwise-upsample"])
def test_grouped_transposed_convolution_kernels_compile_for_sm90a(name):
    import shutil

    pytest.importorskip("tilelang")
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not on PATH")
    from tilefuse.codegen.cuda import build_all

    model, _ = deconv_model(name)
    graph = with_precision(import_onnx(onnx.load_from_string(model), {}), "fp16")
    target = precision_target(CUDA_SM90A, "fp16")
    programs = [lower_group(g, target).program for g in partition_graph(graph, target).groups]
    for art in build_all(programs, arch="sm_90a"):
        assert art.path.read_bytes()[:4] == b"\x7fELF"
        assert art.path.stat().st_size < 512 * 1024
