"""Movement, gather/scatter, Resize and shape-op converters against onnxruntime.

Each case is one ONNX node; runtime inputs get fresh random values, operands that
must be compile-time constants are initializers. The imported graph is run with the
reference executor and compared with onnxruntime.
"""
from __future__ import annotations


import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from tilefuse.errors import ConversionError, UnsupportedOpError
from tilefuse.frontend import import_onnx
from tilefuse.reference import run_graph
from tests.frontend.node_cases import Case, C, assert_matches, case_inputs, onnxruntime_outputs

RNG = np.random.default_rng()
F32, F16 = np.float32, np.float16


def rand(*shape: int, dtype: type = F32) -> np.ndarray:
    """Random data, never all zeros; integer dtypes get small values."""
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(1, 50, size=shape).astype(dtype)
    return (RNG.standard_normal(shape) + 0.1).astype(dtype)


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def f32(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


MOVEMENT = [
    C("transpose_default", "Transpose", [rand(2, 3, 4)]),
    C("transpose_perm_f16", "Transpose", [rand(2, 3, 4, 5, dtype=F16)], perm=[0, 3, 1, 2]),
    C("reshape_infer_copy", "Reshape", [rand(2, 3, 4), i64(0, -1, 2)], consts=(1,)),
    C("reshape_allowzero", "Reshape", [rand(2, 3, 4), i64(4, 6)], consts=(1,), allowzero=1),
    C("flatten_axis0", "Flatten", [rand(2, 3, 4)], axis=0),
    C("flatten_neg", "Flatten", [rand(2, 3, 4, 5)], axis=-2),
    C("squeeze_axes", "Squeeze", [rand(1, 3, 1, 4), i64(0, -2)], consts=(1,)),
    C("squeeze_all", "Squeeze", [rand(1, 3, 1, 4)]),
    C("squeeze_attr_v11", "Squeeze", [rand(1, 3, 1, 4)], opset=11, axes=[2]),
    C("unsqueeze_neg", "Unsqueeze", [rand(3, 4), i64(0, -1)], consts=(1,)),
    C("unsqueeze_attr_v11", "Unsqueeze", [rand(3, 4)], opset=11, axes=[1]),
    C("expand_bidirectional", "Expand", [rand(3, 1), i64(2, 1, 4)], consts=(1,)),
    C("concat_neg_axis_f16", "Concat", [rand(2, 3, dtype=F16), rand(2, 5, dtype=F16), rand(2, 1, dtype=F16)], axis=-1),
    C("concat_with_empty", "Concat", [rand(2, 3), rand(2, 0), rand(2, 2)], axis=1),
    C("split_with_empty_part", "Split", [rand(4, 3), i64(1, 0, 3)], consts=(1,), outputs=3),
    C("split_sizes", "Split", [rand(7, 3), i64(2, 5)], consts=(1,), outputs=2),
    C("split_equal", "Split", [rand(2, 9)], outputs=3, axis=1),
    C("split_num_outputs_uneven", "Split", [rand(2, 7)], outputs=3, opset=18, axis=-1, num_outputs=3),
    C("slice_basic", "Slice", [rand(6, 7), i64(1, 2), i64(5, -1)], consts=(1, 2)),
    C("slice_neg_step", "Slice", [rand(6, 7), i64(-1), i64(-100), i64(1), i64(-2)], consts=(1, 2, 3, 4)),
    C("slice_clamped", "Slice", [rand(5, 6, 3), i64(-50, 2), i64(50, 1000), i64(-3, 1)], consts=(1, 2, 3)),
    C("slice_neg_step_start_below", "Slice", [rand(3, 4), i64(-10), i64(-10), i64(0), i64(-1)], consts=(1, 2, 3, 4)),
    C("slice_empty", "Slice", [rand(5, 6), i64(4), i64(2), i64(0)], consts=(1, 2, 3)),
    C("pad_constant", "Pad", [rand(2, 3), i64(1, 0, 2, 3), f32(1.5)], consts=(1, 2)),
    C("pad_reflect", "Pad", [rand(1, 4, 5), i64(0, 2, 3, 0, 1, 2)], consts=(1,), mode="reflect"),
    C("pad_edge_f16", "Pad", [rand(3, 4, dtype=F16), i64(2, 1, 0, 3)], consts=(1,), mode="edge"),
    C("pad_wrap", "Pad", [rand(3, 4), i64(1, 2, 2, 1)], consts=(1,), opset=19, mode="wrap"),
    C("pad_negative_crop", "Pad", [rand(4, 6), i64(-1, 2, 1, -3)], consts=(1,)),
    C("pad_axes", "Pad", [rand(2, 3, 4), i64(1, 2), None, i64(-1)], consts=(1, 3), opset=18),
    C("tile", "Tile", [rand(2, 3), i64(3, 2)], consts=(1,)),
    C("tile_int", "Tile", [rand(2, 1, 3, dtype=np.int32), i64(1, 4, 2)], consts=(1,)),
    C("depth_to_space_dcr", "DepthToSpace", [rand(2, 8, 3, 2)], blocksize=2),
    C("depth_to_space_crd", "DepthToSpace", [rand(1, 18, 2, 3)], blocksize=3, mode="CRD"),
    C("space_to_depth", "SpaceToDepth", [rand(2, 3, 4, 6)], blocksize=2),
    C("center_crop_pad", "CenterCropPad", [rand(5, 4, 3), i64(2, 7)], consts=(1,), opset=18, axes=[0, 1]),
]

GATHER_SCATTER = [
    C("gather_neg_idx", "Gather", [rand(5, 4), np.array([[0, -1], [3, -5]], np.int64)], axis=0),
    C("gather_scalar_idx_f16", "Gather", [rand(3, 5, dtype=F16), np.array(-2, np.int64)], axis=1),
    C("gather_const_idx_int32", "Gather", [rand(4, 6), np.array([5, 0, 2], np.int32)], consts=(1,), axis=-1),
    C("gather_elements", "GatherElements", [rand(3, 4), np.array([[0, -1, 2, 1], [2, 2, 0, -3]], np.int64)], axis=0),
    C("gather_nd_batch", "GatherND", [rand(2, 3, 4), np.array([[[1, 2]], [[0, -1]]], np.int64)], batch_dims=1),
    C("gather_nd", "GatherND", [rand(3, 4, 2), np.array([[2], [0]], np.int64)]),
    C("scatter_nd_add", "ScatterND", [rand(4, 3), np.array([[1], [3], [1]], np.int64), rand(3, 3)], opset=18,
      reduction="add"),
    C("scatter_nd", "ScatterND", [rand(4, 3), np.array([[1, 2], [-1, 0]], np.int64), rand(2)]),
    C("scatter_elements_max", "ScatterElements", [rand(3, 4), np.array([[0, 1], [2, 0]], np.int64), rand(2, 2)],
      opset=18, axis=1, reduction="max"),
    C("scatter_elements_neg", "ScatterElements", [rand(3, 4), np.array([[-1, 1, 0]], np.int64), rand(1, 3)], axis=0),
    C("reverse_sequence", "ReverseSequence", [rand(5, 3, 2), i64(5, 2, 0)], consts=(1,), batch_axis=1, time_axis=0),
    C("reverse_sequence_batch0", "ReverseSequence", [rand(3, 4), i64(1, 4, 3)], consts=(1,), batch_axis=0, time_axis=1),
    C("compress_axis", "Compress", [rand(3, 5), np.array([1, 0, 1, 1], bool)], consts=(1,), axis=1),
    C("compress_flat", "Compress", [rand(2, 3), np.array([0, 1, 0, 0, 1], bool)], consts=(1,)),
]

SHAPE_OPS = [
    C("shape", "Shape", [rand(2, 3, 4)]),
    C("shape_start_end", "Shape", [rand(2, 3, 4, 5)], start=1, end=-1),
    C("size", "Size", [rand(2, 3, 4)]),
    C("constant_of_shape", "ConstantOfShape", [i64(2, 3)], consts=(0,),
      value=numpy_helper.from_array(np.array([7], np.int32))),
    C("range_float", "Range", [np.array(v, F32) for v in (1.5, 7.0, 0.75)], consts=(0, 1, 2)),
    C("range_int_neg", "Range", [np.array(v, np.int64) for v in (10, -3, -4)], consts=(0, 1, 2)),
    C("eyelike", "EyeLike", [rand(4, 5)], k=1, dtype=T.INT32),
    C("eyelike_neg_k", "EyeLike", [rand(5, 3)], k=-2),
    C("trilu_upper", "Trilu", [rand(2, 4, 5), i64(1)], consts=(1,)),
    C("trilu_lower_f16", "Trilu", [rand(5, 4, dtype=F16), i64(-1)], consts=(1,), upper=0),
    C("onehot", "OneHot", [np.array([[1, -1], [0, 7]], np.int64), i64(5), f32(-2, 3)], consts=(1,)),
    C("onehot_axis0", "OneHot", [np.array([2, -3, 0], np.int32), np.array(4, F32), f32(0, 1)], consts=(1, 2), axis=0),
    C("constant_value_floats", "Constant", [], value_floats=[1.0, 2.5, -3.0]),
    C("constant_value_int", "Constant", [], value_int=7),
    C("constant_tensor_f16", "Constant", [], value=numpy_helper.from_array(rand(2, 3, dtype=F16))),
    C("nonzero_const", "NonZero", [np.array([[1, 0, 3], [0, 0, 2]], np.float32)], consts=(0,)),
]


def _const_node(name: str, value: onnx.TensorProto | None = None, **attrs) -> onnx.NodeProto:
    return h.make_node("Constant", [], [name], **({"value": value} if value is not None else attrs))


def build(case: Case) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The case as a one-node model, and the feeds for its graph inputs."""
    names, graph_inputs, inits, feeds = case_inputs(case)
    outs = [f"out{i}" for i in range(case.outputs)]
    node = h.make_node(case.op, names, outs, **case.attrs)
    return _model([node], graph_inputs, outs, inits, case.opset), feeds


def _model(nodes, graph_inputs, outs, inits, opset) -> onnx.ModelProto:
    # Output types come from onnx's shape inference, so a case need not state them.
    untyped = [h.make_empty_tensor_value_info(o) for o in outs]
    g = h.make_graph(nodes, "case", graph_inputs, untyped, initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 10
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    known = {vi.name: vi for vi in inferred.graph.value_info}
    del m.graph.output[:]
    m.graph.output.extend(known.get(o) or next(v for v in inferred.graph.output if v.name == o) for o in outs)
    return m


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    shapes = {k: v.shape for k, v in feeds.items()}
    graph = import_onnx(model, shapes)
    got = run_graph(graph, feeds)
    assert_matches(got, onnxruntime_outputs(model, feeds))


@pytest.mark.parametrize("case", MOVEMENT + GATHER_SCATTER + SHAPE_OPS, ids=lambda c: c.id)
def test_against_onnxruntime(case: Case) -> None:
    check(*build(case))


# -- Resize -----------------------------------------------------------------------------


def R(id: str, x: np.ndarray, *, scales=None, sizes=None, roi=None, opset: int = 19, **attrs) -> Case:
    inputs = [x, roi, None if scales is None else f32(*scales), None if sizes is None else i64(*sizes)]
    return Case(id, "Resize", inputs, attrs, consts=(1, 2, 3), opset=opset)


RESIZE = [
    R("nearest_up_half_pixel", rand(1, 2, 3, 4), scales=(1, 1, 2, 3)),
    R("nearest_down_prefer_ceil", rand(1, 1, 8, 6), sizes=(1, 1, 3, 4), nearest_mode="round_prefer_ceil"),
    R("nearest_asymmetric_floor_int8", rand(1, 2, 4, 4, dtype=np.int8), scales=(1, 1, 2, 0.5),
      coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    R("nearest_align_corners_ceil", rand(2, 5, 3), sizes=(2, 9, 7), coordinate_transformation_mode="align_corners",
      nearest_mode="ceil"),
    R("linear_up_half_pixel", rand(1, 3, 4, 5), scales=(1, 1, 2, 2), mode="linear"),
    R("linear_down_sizes", rand(1, 2, 9, 7), sizes=(1, 2, 4, 3), mode="linear"),
    R("linear_align_corners", rand(1, 1, 4, 5), sizes=(1, 1, 7, 3), mode="linear",
      coordinate_transformation_mode="align_corners"),
    R("linear_pytorch_half_pixel", rand(2, 3, 6), sizes=(2, 5, 4), mode="linear",
      coordinate_transformation_mode="pytorch_half_pixel"),
    R("linear_asymmetric_3d", rand(1, 1, 3, 4, 5), scales=(1, 1, 2, 1.5, 2), mode="linear",
      coordinate_transformation_mode="asymmetric"),
    R("linear_f16", rand(1, 2, 4, 6, dtype=F16), scales=(1, 1, 2, 0.5), mode="linear"),
    R("linear_axes", rand(2, 3, 4, 5), sizes=(7, 3), axes=[3, 1], mode="linear"),
    R("linear_keep_aspect_not_larger", rand(1, 1, 4, 6), sizes=(8, 9), axes=[2, 3], mode="linear",
      keep_aspect_ratio_policy="not_larger"),
    R("linear_tf_crop_and_resize", rand(1, 1, 5, 6), sizes=(1, 1, 4, 3), roi=f32(0, 0, 0.2, -0.1, 1, 1, 0.9, 1.3),
      mode="linear", coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=-3.0),
    R("cubic_up", rand(1, 1, 4, 5), scales=(1, 1, 2, 1.6), mode="cubic"),
    R("cubic_exclude_outside", rand(1, 2, 5, 5), sizes=(1, 2, 8, 3), mode="cubic", cubic_coeff_a=-0.5,
      exclude_outside=1),
    R("linear_antialias_down", rand(1, 1, 12, 10), sizes=(1, 1, 5, 4), mode="linear", antialias=1),
    R("cubic_antialias_strong_down", rand(1, 1, 40, 6), sizes=(1, 1, 5, 6), mode="cubic", antialias=1),
    R("linear_uint8", rand(1, 1, 4, 4, dtype=np.uint8), scales=(1, 1, 2, 2), mode="linear"),
]


@pytest.mark.parametrize("case", RESIZE, ids=lambda c: c.id)
def test_resize_against_onnxruntime(case: Case) -> None:
    check(*build(case))


def test_resize_nearest_is_one_gather_per_axis() -> None:
    model, feeds = build(R("n", rand(1, 2, 3, 4), scales=(1, 1, 2, 3)))
    graph = import_onnx(model, {k: v.shape for k, v in feeds.items()})
    assert [n.op.name for n in graph.nodes] == ["Gather", "Gather"]


# -- folding and constraints --------------------------------------------------------------


def test_shape_subgraph_folds_away() -> None:
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape leaves just the Reshape."""
    nodes = [
        h.make_node("Shape", ["x"], ["s"]),
        _const_node("i0", numpy_helper.from_array(np.array(0, np.int64))),
        h.make_node("Gather", ["s", "i0"], ["d0"], axis=0),
        _const_node("ax", numpy_helper.from_array(i64(0))),
        h.make_node("Unsqueeze", ["d0", "ax"], ["d0v"]),
        _const_node("minus1", value_ints=[-1]),
        h.make_node("Concat", ["d0v", "minus1"], ["shape"], axis=0),
        h.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    x = rand(2, 3, 4)
    model = _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, x.shape)], ["y"], [], 17)
    graph = import_onnx(model, {"x": x.shape})
    assert [n.op.name for n in graph.nodes] == ["Reshape"]
    check(model, {"x": x})


def test_constant_sparse_value_is_densified() -> None:
    # onnxruntime returns a sparse tensor here, so compare with the dense array.
    sparse = h.make_sparse_tensor(numpy_helper.from_array(f32(1.5, -2.0)), numpy_helper.from_array(i64(1, 5)), [2, 3])
    model, _ = build(C("sparse", "Constant", [], sparse_value=sparse))
    got = run_graph(import_onnx(model), {})["out0"]
    np.testing.assert_array_equal(got, np.array([[0, 1.5, 0], [0, 0, -2.0]], np.float32))


def test_nonzero_of_runtime_input_needs_a_constant() -> None:
    model, feeds = build(C("nz", "NonZero", [rand(3, 4)]))
    with pytest.raises(ConversionError, match="data-dependent output shape"):
        import_onnx(model, {k: v.shape for k, v in feeds.items()})


def test_resize_unknown_mode_is_unsupported() -> None:
    model, feeds = build(R("bad", rand(1, 1, 2, 2), scales=(1, 1, 2, 2)))
    model.graph.node[0].attribute.append(h.make_attribute("mode", "lanczos"))
    with pytest.raises(UnsupportedOpError, match="mode=lanczos"):
        import_onnx(model, {k: v.shape for k, v in feeds.items()}, check_shapes=False)
