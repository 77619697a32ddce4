"""The window schedule (tile_ir/lower/windows.py): pooling with a fused ReLU before it and
a residual Add after it, one ONNX model per window shape.

Each case checks that the whole model is one kernel on the window schedule for both
targets, with nothing but a tile of running values on chip; that the CPU plan matches
onnxruntime and the reference executor (float32: max abs error 1e-4 x the output's scale,
float16: 1e-2 x scale, ``tilefuse.compare``); and that the GPU's TileProgram (its own tile
sizes and grid), run by the tile interpreter, matches the reference too.
"""
import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import tilefuse
from tilefuse.compare import compare_output
from tilefuse.compiler import compile_model
from tilefuse.frontend import import_onnx
from tilefuse.partition import partition_graph
from tilefuse.reference import run_graph
from tilefuse.target import CPU, CUDA_SM90A
from tilefuse.tile_ir import lower_group
from tilefuse.tile_ir.interpret import run_program

CASES = {
    # name: (op, x shape, attrs, dtype)
    "max_stem_3x3_s2_p1": ("MaxPool", (2, 4, 13, 15), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), "float32"),
    "max_ceil_mode": ("MaxPool", (1, 3, 10, 11), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1), "float32"),
    "max_dilated_asym_pads": ("MaxPool", (1, 3, 12, 11), dict(kernel_shape=[2, 3], dilations=[2, 2], pads=[1, 0, 1, 2]), "float32"),
    "max_same_upper": ("MaxPool", (2, 2, 9, 10), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"), "float32"),
    "max_1d": ("MaxPool", (2, 3, 20), dict(kernel_shape=[4], strides=[3], pads=[1, 2]), "float32"),
    "max_3d": ("MaxPool", (1, 2, 5, 6, 7), dict(kernel_shape=[2, 2, 2], strides=[2, 2, 2]), "float32"),
    "max_float16": ("MaxPool", (2, 8, 14, 14), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), "float16"),
    "avg_count_include_pad": ("AveragePool", (2, 3, 11, 12), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                                                                   count_include_pad=1), "float32"),
    "avg_exclude_pad": ("AveragePool", (2, 3, 11, 12), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
                                                             count_include_pad=0), "float32"),
    "avg_ceil_exclude_pad": ("AveragePool", (1, 4, 10, 10), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 0, 0],
                                                                  ceil_mode=1), "float32"),
    "lp_pool_p2": ("LpPool", (1, 3, 8, 9), dict(kernel_shape=[2, 2], strides=[2, 1], p=2), "float32"),
    "global_average": ("GlobalAveragePool", (2, 16, 7, 7), {}, "float32"),
    "global_average_float16": ("GlobalAveragePool", (2, 64, 7, 7), {}, "float16"),
    "global_max": ("GlobalMaxPool", (2, 8, 5, 6), {}, "float32"),
    # rows of 16 or more: a host folds them in vector lanes (whole runs of 16, then the rest)
    "global_average_lanes": ("GlobalAveragePool", (1, 32, 9, 37), {}, "float32"),
    "global_max_lanes": ("GlobalMaxPool", (2, 6, 3, 40), {}, "float32"),
    "global_average_lanes_float16": ("GlobalAveragePool", (1, 8, 4, 64), {}, "float16"),
}


def _pooled_shape(op, x_shape, attrs, elem):
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "p", [helper.make_tensor_value_info("x", elem, list(x_shape))],
                              [helper.make_tensor_value_info("y", elem, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    dims = inferred.graph.output[0].type.tensor_type.shape.dim
    return tuple(d.dim_value for d in dims)


def _model(op, x_shape, attrs, dtype):
    """x -> Relu -> Sub(1) -> pool -> (Flatten for a global pool) -> Add(r) -> y. The
    prologue's clipped inputs become -1, so a padded position read as 0 instead of the
    reduction's identity would win a max pool's border window."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    y_shape = _pooled_shape(op, x_shape, attrs, elem)
    nodes = [helper.make_node("Relu", ["x"], ["a0"]), helper.make_node("Sub", ["a0", "one"], ["a"]),
             helper.make_node(op, ["a"], ["p"], **attrs)]
    if op.startswith("Global"):
        nodes.append(helper.make_node("Flatten", ["p"], ["f"]))
        y_shape = (y_shape[0], math.prod(y_shape[1:]))
    else:
        nodes.append(helper.make_node("Identity", ["p"], ["f"]))
    nodes.append(helper.make_node("Add", ["f", "r"], ["y"]))
    graph = helper.make_graph(
        nodes, "pool", [helper.make_tensor_value_info("x", elem, list(x_shape)),
                        helper.make_tensor_value_info("r", elem, list(y_shape))],
        [helper.make_tensor_value_info("y", elem, list(y_shape))],
        [onnx.numpy_helper.from_array(np.ones((), dtype), "one")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), y_shape


def _feeds(x_shape, y_shape, dtype, seed):
    rng = np.random.default_rng(seed)
    # random and never zero: most inputs are negative (the ReLU clips them, so whole border
    # windows are clipped), the rest distinct positive values: a wrong tap or pad shows
    return {"x": (rng.standard_normal(x_shape) - 1.0).astype(dtype),
            "r": (rng.standard_normal(y_shape) * 0.5 + 1.0).astype(dtype)}


@pytest.mark.parametrize("name", list(CASES))
def test_pooling_runs_on_window_tiles(name, tmp_path):
    op, x_shape, attrs, dtype = CASES[name]
    model, y_shape = _model(op, x_shape, attrs, dtype)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    feeds = _feeds(x_shape, y_shape, dtype, seed=len(name))
    graph = import_onnx(model, {k: v.shape for k, v in feeds.items()})
    (want_ref,) = run_graph(graph, feeds).values()
    (want_ort,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)

    for target in (CPU, CUDA_SM90A):
        groups = [g for g in partition_graph(graph, target).groups if str(g.kind) != "opaque"]
        assert len(groups) == 1, (target.name, [g.name for g in groups])  # ReLU, pool and Add: one kernel
        low = lower_group(groups[0], target)
        notes = low.program.notes
        assert notes[0].startswith("window:"), (target.name, notes)
        # the tile's running values (and a host's lanes), no staged tensor
        # (a global pool's map as one run: 9 x 9 folds 81 terms in lanes)
        lanes = target is CPU and op.startswith("Global") and math.prod(x_shape[2:]) >= 16
        acc, *part = low.program.allocs
        assert math.prod(acc.shape) <= target.window.tile and [b.shape for b in part] == ([(*acc.shape, 16)] if lanes else [])
        # a host folds a window tap by tap over the tile (the last dim's loop without tests),
        # a global pool's rows in vector lanes
        assert ("taps outermost" in notes[0]) == (target is CPU and not op.startswith("Global")), (target.name, notes)
        assert ("lanes" in notes[0]) == lanes, (target.name, notes)
        if True:  # each target's tiles and grid (the host's tap order too), through the oracle
            arrays = [feeds[v.name] if not v.is_constant else np.ascontiguousarray(v.data) for v in low.bindings[:-1]]
            out = np.zeros(y_shape, dtype)
            run_program(low.program, [*arrays, out])
            c = compare_output("y", out, want_ref)
            assert c.ok, f"{name} interpreted for {target.name}: {c.problem}"

    (got,) = tilefuse.InferenceSession(compile_model(path, "cpu").plan).run(None, feeds)
    for what, want in (("onnxruntime", want_ort), ("reference", want_ref)):
        c = compare_output("y", got, want)
        assert c.ok, f"{name} against {what}: {c.problem}"


def test_a_resnet50_stem_pool_fits_a_gpu_block():
    """The stem's 3x3 stride-2 max pool of 64 x 112 x 112 (784 KB staged): tiles of a few
    output rows, one output per thread, a grid that fills the GPU at batch 1."""
    from tilefuse.ir import Builder, DType, TensorType
    from tilefuse.ir.prims import ReduceFn, WindowReduce

    b = Builder("pool")
    x = b.input("x", TensorType(DType.FLOAT16, (1, 64, 112, 112)))
    b.output("y", b.emit1(WindowReduce(ReduceFn.MAX, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)), x))
    (group,) = partition_graph(b.graph, CUDA_SM90A).groups
    p = lower_group(group, CUDA_SM90A).program
    assert p.notes[0].startswith("window:")
    assert p.threads == math.prod(p.allocs[0].shape) <= CUDA_SM90A.window.max_threads
    assert math.prod(p.grid) >= CUDA_SM90A.device.cores
