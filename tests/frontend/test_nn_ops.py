"""Contraction, pooling, normalization, attention and einsum converters against onnxruntime.

Each case is one ONNX node; runtime inputs get fresh random values, initializers
stand for weights. The imported graph runs on the reference executor.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from tilefuse.errors import TilefuseError, UnsupportedOpError
from tilefuse.frontend import import_onnx
from tilefuse.frontend.importer import convert_graph
from tilefuse.ir.dtypes import DType
from tilefuse.ir.types import TensorType
from tilefuse.reference import run_graph
from tests.frontend.node_cases import Case, C, assert_matches, case_inputs, one_node_model, onnxruntime_outputs

RNG = np.random.default_rng()
F32, F16 = np.float32, np.float16


def rand(*shape: int, dtype: type = F32, positive: bool = False) -> np.ndarray:
    """Random data, never all zeros; integer dtypes get small values."""
    if np.dtype(dtype).kind in "iu":
        return RNG.integers(-20, 20, size=shape).astype(dtype)
    x = RNG.standard_normal(shape) + 0.1
    return (np.abs(x) + 0.5 if positive else x).astype(dtype)


def mask(*shape: int) -> np.ndarray:
    """A boolean attention mask with every row keeping its first key."""
    m = RNG.random(shape) > 0.4
    m[..., 0] = True
    return m


def build(case: Case) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    names, graph_inputs, inits, feeds = case_inputs(case)
    wanted = (True,) * case.outputs if isinstance(case.outputs, int) else case.outputs
    outs = [f"out{i}" if w else "" for i, w in enumerate(wanted)]
    node = h.make_node(case.op, names, outs, **case.attrs)
    outs = [o for o in outs if o]
    m = one_node_model(case, node, graph_inputs, inits, outs)
    # Output types come from onnx's shape inference; where it gives none (some function
    # ops, all shape-preserving here), the output has the first input's type.
    inferred = onnx.shape_inference.infer_shapes(m)
    del m.graph.output[:]
    for vi in inferred.graph.output:
        if not vi.type.tensor_type.HasField("shape"):
            vi = h.make_tensor_value_info(vi.name, h.np_dtype_to_tensor_dtype(case.inputs[0].dtype), case.inputs[0].shape)
        m.graph.output.append(vi)
    return m, feeds


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    graph = import_onnx(model, {k: v.shape for k, v in feeds.items()})
    got = run_graph(graph, feeds)
    assert_matches(got, onnxruntime_outputs(model, feeds))


CONTRACT = [
    C("matmul_2d", "MatMul", [rand(3, 4), rand(4, 5)]),
    C("matmul_vec_left", "MatMul", [rand(4), rand(2, 4, 5)]),
    C("matmul_vec_right", "MatMul", [rand(2, 3, 4), rand(4)]),
    C("matmul_vec_vec", "MatMul", [rand(6), rand(6)]),
    C("matmul_batch_broadcast", "MatMul", [rand(2, 1, 3, 4), rand(5, 4, 6)]),
    C("matmul_f16", "MatMul", [rand(2, 8, 16, dtype=F16), rand(16, 8, dtype=F16)]),
    C("matmul_int32", "MatMul", [rand(3, 4, dtype=np.int32), rand(4, 2, dtype=np.int32)]),
    C("gemm_plain", "Gemm", [rand(3, 4), rand(4, 5)]),
    C("gemm_trans_alpha_beta", "Gemm", [rand(4, 3), rand(5, 4), rand(5)], consts=(1, 2), transA=1, transB=1, alpha=0.5, beta=2.0),
    C("gemm_bias_col", "Gemm", [rand(3, 4), rand(4, 5), rand(3, 1)], beta=-1.0),
    C("gemm_f16", "Gemm", [rand(8, 16, dtype=F16), rand(16, 4, dtype=F16), rand(8, 4, dtype=F16)]),
    C("conv1d_stride_pad", "Conv", [rand(2, 3, 11), rand(4, 3, 3), rand(4)], consts=(1, 2), strides=[2], pads=[1, 2]),
    C("conv2d_bias", "Conv", [rand(1, 3, 8, 7), rand(5, 3, 3, 3), rand(5)], consts=(1, 2), pads=[1, 1, 1, 1]),
    C("conv2d_groups_dilation", "Conv", [rand(2, 4, 9, 9), rand(6, 2, 3, 2)], consts=(1,), group=2, dilations=[2, 3]),
    C("conv2d_depthwise_same_upper", "Conv", [rand(1, 3, 7, 6), rand(3, 1, 3, 3)], consts=(1,), group=3, strides=[2, 2], auto_pad="SAME_UPPER"),
    C("conv2d_same_lower", "Conv", [rand(1, 2, 6, 6), rand(3, 2, 4, 4)], consts=(1,), auto_pad="SAME_LOWER"),
    C("conv2d_valid_runtime_weight", "Conv", [rand(1, 2, 6, 5), rand(3, 2, 2, 2)], auto_pad="VALID", strides=[2, 1]),
    C("conv3d", "Conv", [rand(1, 2, 5, 6, 4), rand(3, 2, 3, 3, 2), rand(3)], consts=(1, 2), pads=[1, 0, 1, 1, 0, 0]),
    C("conv2d_f16", "Conv", [rand(1, 4, 6, 6, dtype=F16), rand(8, 4, 3, 3, dtype=F16), rand(8, dtype=F16)], consts=(1, 2)),
    C("convT_1d", "ConvTranspose", [rand(2, 3, 5), rand(3, 4, 3), rand(4)], consts=(1, 2)),
    C("convT_stride_outpad", "ConvTranspose", [rand(1, 2, 4, 3), rand(2, 3, 3, 3)], consts=(1,), strides=[2, 3], output_padding=[1, 2]),
    C("convT_pads_dilation", "ConvTranspose", [rand(1, 2, 5, 5), rand(2, 2, 3, 2)], consts=(1,), pads=[1, 0, 2, 1], dilations=[2, 2]),
    C("convT_groups", "ConvTranspose", [rand(2, 4, 3, 3), rand(4, 3, 2, 2), rand(6)], consts=(1, 2), group=2, strides=[2, 2]),
    C("convT_output_shape", "ConvTranspose", [rand(1, 1, 3, 3), rand(1, 2, 3, 3)], consts=(1,), strides=[2, 2], output_shape=[5, 5]),
    # output_shape past the full result (by less than a stride): grown at the end whatever
    # auto_pad says, as onnxruntime does (SAME_UPPER used to grow at the beginning)
    C("convT_output_shape_grow_same_upper", "ConvTranspose", [rand(1, 1, 3, 4), rand(1, 2, 3, 3)], consts=(1,),
      strides=[2, 3], output_shape=[8, 11], auto_pad="SAME_UPPER"),
    C("convT_output_shape_grow_notset", "ConvTranspose", [rand(1, 1, 3), rand(1, 2, 3)], consts=(1,), strides=[3],
      output_shape=[10]),
    C("convT_same_upper_even", "ConvTranspose", [rand(1, 2, 3, 4), rand(2, 2, 4, 4)], consts=(1,), strides=[2, 2], auto_pad="SAME_UPPER"),
    # stride == kernel: one product whose rows are scattered into non-overlapping patches
    C("convT_patches_2d", "ConvTranspose", [rand(2, 3, 4, 5), rand(3, 4, 2, 2), rand(4)], consts=(1, 2), strides=[2, 2]),
    C("convT_patches_1d_runtime_weight", "ConvTranspose", [rand(2, 3, 5), rand(3, 2, 3)], strides=[3]),
    C("convT_patches_3d_f16", "ConvTranspose", [rand(1, 2, 2, 3, 2, dtype=F16), rand(2, 3, 2, 1, 2, dtype=F16)], consts=(1,),
      strides=[2, 1, 2]),
    C("convT_f16", "ConvTranspose", [rand(1, 4, 4, 4, dtype=F16), rand(4, 2, 3, 3, dtype=F16)], consts=(1,), strides=[2, 2]),
]

POOL = [
    C("maxpool_2d", "MaxPool", [rand(2, 3, 8, 7)], kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1]),
    C("maxpool_ceil", "MaxPool", [rand(1, 2, 7, 8)], kernel_shape=[3, 3], strides=[2, 3], ceil_mode=1),
    C("maxpool_dilation", "MaxPool", [rand(1, 2, 9, 9)], kernel_shape=[2, 2], dilations=[2, 3]),
    C("maxpool_same_upper", "MaxPool", [rand(1, 2, 7, 6)], kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
    C("maxpool_1d", "MaxPool", [rand(2, 3, 10)], kernel_shape=[3], strides=[2]),
    C("maxpool_3d", "MaxPool", [rand(1, 2, 5, 6, 4)], kernel_shape=[2, 3, 2], pads=[1, 1, 0, 0, 1, 1]),
    C("maxpool_int8", "MaxPool", [rand(1, 2, 6, 6, dtype=np.int8)], kernel_shape=[2, 2], pads=[1, 1, 1, 1]),
    C("maxpool_f16", "MaxPool", [rand(1, 4, 6, 6, dtype=F16)], kernel_shape=[3, 3]),
    C("maxpool_indices", "MaxPool", [rand(2, 2, 7, 6)], outputs=2, kernel_shape=[3, 2], strides=[2, 2], pads=[1, 1, 0, 0]),
    C("maxpool_indices_col_major", "MaxPool", [rand(1, 3, 5, 6)], outputs=2, kernel_shape=[2, 2], storage_order=1),
    C("avgpool_exclude_pad", "AveragePool", [rand(2, 3, 7, 7)], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
    C("avgpool_include_pad", "AveragePool", [rand(1, 2, 6, 5)], kernel_shape=[3, 2], pads=[1, 0, 2, 1], count_include_pad=1),
    C("avgpool_ceil", "AveragePool", [rand(1, 2, 7, 8)], kernel_shape=[3, 3], strides=[2, 3], ceil_mode=1),
    C("avgpool_ceil_include_pad", "AveragePool", [rand(1, 1, 6, 6)], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1],
      ceil_mode=1, count_include_pad=1),
    C("avgpool_same_lower", "AveragePool", [rand(1, 2, 5, 6)], kernel_shape=[2, 3], auto_pad="SAME_LOWER"),
    C("avgpool_dilation_v19", "AveragePool", [rand(1, 2, 8, 8)], opset=19, kernel_shape=[2, 2], dilations=[2, 2]),
    C("avgpool_1d_f16", "AveragePool", [rand(2, 3, 9, dtype=F16)], kernel_shape=[4], strides=[2], pads=[1, 1]),
    C("lppool_p2", "LpPool", [rand(1, 2, 6, 6)], kernel_shape=[2, 2], strides=[2, 2]),
    C("lppool_p1_pads", "LpPool", [rand(1, 2, 5, 5)], kernel_shape=[3, 3], p=1, pads=[1, 1, 1, 1]),
    C("lppool_p3", "LpPool", [rand(1, 2, 6, 4)], kernel_shape=[2, 2], p=3),
    C("global_avg", "GlobalAveragePool", [rand(2, 3, 5, 4)]),
    C("global_avg_f16", "GlobalAveragePool", [rand(2, 3, 16, 16, dtype=F16)]),
    C("global_max", "GlobalMaxPool", [rand(2, 3, 5, 4, 2)]),
    C("global_lp", "GlobalLpPool", [rand(2, 3, 5)], p=3),
]

NORM = [
    C("batchnorm_weights", "BatchNormalization", [rand(2, 3, 4, 5), rand(3), rand(3), rand(3), rand(3, positive=True)], consts=(1, 2, 3, 4)),
    C("batchnorm_runtime_stats", "BatchNormalization", [rand(2, 4, 3), rand(4), rand(4), rand(4), rand(4, positive=True)], epsilon=1e-3),
    C("batchnorm_f16", "BatchNormalization", [rand(2, 3, 4, 4, dtype=F16), *(rand(3, dtype=F16) for _ in range(3)),
                                              rand(3, dtype=F16, positive=True)], consts=(1, 2, 3, 4)),
    C("layernorm_last", "LayerNormalization", [rand(2, 3, 16), rand(16), rand(16)], consts=(1, 2)),
    C("layernorm_axis1_3_outputs", "LayerNormalization", [rand(2, 3, 4, 5), rand(3, 4, 5)], outputs=3, axis=1, epsilon=1e-3),
    C("layernorm_f16_3_outputs", "LayerNormalization", [rand(2, 5, 32, dtype=F16), rand(32, dtype=F16), rand(32, dtype=F16)],
      consts=(1, 2), outputs=3),
    C("instancenorm", "InstanceNormalization", [rand(2, 3, 4, 5), rand(3), rand(3)], consts=(1, 2)),
    C("instancenorm_f16", "InstanceNormalization", [rand(2, 3, 16, dtype=F16), rand(3, dtype=F16), rand(3, dtype=F16)]),
    C("groupnorm_v21_per_channel", "GroupNormalization", [rand(2, 6, 5), rand(6), rand(6)], consts=(1, 2), opset=21, num_groups=2),
    C("rmsnorm", "RMSNormalization", [rand(2, 3, 16), rand(16)], consts=(1,), opset=23),
    C("rmsnorm_axis1_f16", "RMSNormalization", [rand(2, 4, 8, dtype=F16), rand(4, 8, dtype=F16)], opset=23, axis=1),
    C("lpnorm_p2", "LpNormalization", [rand(3, 4, 5)], axis=1),
    C("lpnorm_p1", "LpNormalization", [rand(3, 4)], p=1),
    C("mvn_default", "MeanVarianceNormalization", [rand(2, 3, 4, 5)]),
    C("mvn_axes", "MeanVarianceNormalization", [rand(2, 3, 4)], axes=[2]),
]


def A(id: str, inputs: list, outputs: int = 1, **attrs) -> Case:
    return Case(id, "Attention", inputs, attrs, (), outputs, 23)


ATTENTION = [
    A("mha_4d", [rand(2, 3, 4, 8), rand(2, 3, 6, 8), rand(2, 3, 6, 8)]),
    A("mha_3d_heads", [rand(2, 4, 24), rand(2, 5, 24), rand(2, 5, 12)], q_num_heads=3, kv_num_heads=3),
    A("gqa_causal", [rand(1, 4, 5, 8), rand(1, 2, 5, 8), rand(1, 2, 5, 8)], is_causal=1),
    A("gqa_3d", [rand(2, 3, 32), rand(2, 5, 16), rand(2, 5, 16)], q_num_heads=4, kv_num_heads=2),
    A("bool_mask", [rand(2, 2, 4, 8), rand(2, 2, 6, 8), rand(2, 2, 6, 8), mask(2, 1, 4, 6)]),
    A("float_mask_scale", [rand(1, 2, 3, 8), rand(1, 2, 5, 8), rand(1, 2, 5, 8), rand(3, 5)], scale=0.3),
    A("softcap", [rand(1, 2, 4, 8), rand(1, 2, 4, 8), rand(1, 2, 4, 8)], softcap=2.0),
    A("past_present_causal", [rand(1, 2, 3, 8), rand(1, 2, 3, 8), rand(1, 2, 3, 8), None, rand(1, 2, 4, 8), rand(1, 2, 4, 8)],
      outputs=3, is_causal=1),
    A("past_mask_qk_mode0", [rand(1, 2, 2, 8), rand(1, 2, 2, 8), rand(1, 2, 2, 8), rand(1, 2, 2, 5), rand(1, 2, 3, 8),
                             rand(1, 2, 3, 8)], outputs=4),
    A("qk_mode2_bias", [rand(1, 2, 3, 8), rand(1, 2, 4, 8), rand(1, 2, 4, 8), rand(3, 4)], outputs=(True, False, False, True),
      qk_matmul_output_mode=2),
    A("qk_mode3_softmax", [rand(1, 2, 3, 8), rand(1, 2, 4, 8), rand(1, 2, 4, 8)], outputs=(True, False, False, True),
      qk_matmul_output_mode=3),
    A("f16_causal", [rand(1, 2, 6, 16, dtype=F16), rand(1, 2, 6, 16, dtype=F16), rand(1, 2, 6, 16, dtype=F16)], is_causal=1),
]


def E(id: str, equation: str, *inputs: np.ndarray) -> Case:
    return Case(id, "Einsum", list(inputs), {"equation": equation})


EINSUM = [
    E("matmul", "ij,jk->ik", rand(3, 4), rand(4, 5)),
    E("batch_matmul", "bij,bjk->bik", rand(2, 3, 4), rand(2, 4, 5)),
    E("implicit", "ij,jk", rand(3, 4), rand(4, 5)),
    E("attention_scores", "bhqd,bhkd->bhqk", rand(2, 3, 4, 8), rand(2, 3, 5, 8)),
    E("transpose", "ijk->kij", rand(2, 3, 4)),
    E("row_sum", "ij->i", rand(3, 4)),
    E("total", "ij->", rand(3, 4)),
    E("trace", "ii", rand(4, 4)),
    E("diagonal", "ii->i", rand(5, 5)),
    E("batch_diagonal", "...ii->...i", rand(2, 3, 4, 4)),
    E("inner", "i,i", rand(6), rand(6)),
    E("outer", "i,j->ij", rand(3), rand(4)),
    E("hadamard", "ij,ij->ij", rand(3, 4), rand(3, 4)),
    E("ellipsis_broadcast", "...ij,...jk->...ik", rand(2, 1, 3, 4), rand(1, 5, 4, 2)),
    E("three_operands", "ij,jk,kl->il", rand(2, 3), rand(3, 4), rand(4, 5)),
    E("sum_free_and_contract", "abc,cd->ad", rand(2, 3, 4), rand(4, 5)),
    E("upper_case_labels", "Ab,bC->CA", rand(3, 4), rand(4, 2)),
    E("f16", "bij,bjk->bki", rand(2, 4, 8, dtype=F16), rand(2, 8, 3, dtype=F16)),
]


@pytest.mark.parametrize("case", CONTRACT + POOL + NORM + ATTENTION + EINSUM, ids=lambda c: c.id)
def test_against_onnxruntime(case: Case) -> None:
    check(*build(case))


def _kinds(model: onnx.ModelProto, shapes: dict) -> Counter:
    graph = import_onnx(model, shapes)
    return Counter(n.op.kind for n in graph.nodes)


def test_layer_norm_and_its_expansion_give_the_same_primitives() -> None:
    """LayerNormalization and ReduceMean/Sub/Mul/Sqrt/Div reach the partitioner alike."""
    x = h.make_tensor_value_info("x", T.FLOAT, [2, 8])
    y = h.make_tensor_value_info("y", T.FLOAT, [2, 8])
    inits = [numpy_helper.from_array(rand(8), "s"), numpy_helper.from_array(rand(8), "b"),
             numpy_helper.from_array(np.array(1e-5, F32), "eps"), numpy_helper.from_array(np.array([-1], np.int64), "ax")]
    fused = h.make_graph([h.make_node("LayerNormalization", ["x", "s", "b"], ["y"])], "ln", [x], [y], inits[:2])
    expanded = h.make_graph([
        h.make_node("ReduceMean", ["x", "ax"], ["m"]), h.make_node("Sub", ["x", "m"], ["d"]),
        h.make_node("Mul", ["d", "d"], ["d2"]), h.make_node("ReduceMean", ["d2", "ax"], ["v"]),
        h.make_node("Add", ["v", "eps"], ["ve"]), h.make_node("Sqrt", ["ve"], ["sd"]),
        h.make_node("Div", ["d", "sd"], ["n"]), h.make_node("Mul", ["n", "s"], ["ns"]), h.make_node("Add", ["ns", "b"], ["y"]),
    ], "ln_expanded", [x], [y], inits)
    models = [h.make_model(g, opset_imports=[h.make_opsetid("", 18)]) for g in (fused, expanded)]
    assert _kinds(models[0], {"x": (2, 8)}) == _kinds(models[1], {"x": (2, 8)})


def test_group_norm_18_scales_per_group() -> None:
    """Opset 18 (deprecated, so the checker refuses it: converted directly) has one
    scale and bias per group; compared with onnxruntime, which still runs it."""
    case = C("g", "GroupNormalization", [rand(2, 6, 4, 3), rand(3), rand(3)], opset=18, num_groups=3)
    model, feeds = build(case)
    types = {k: TensorType(DType.FLOAT32, v.shape) for k, v in feeds.items()}
    got = run_graph(convert_graph(model, types, {}), feeds)["out0"]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, sess.run(None, feeds)[0], rtol=1e-5, atol=1e-5)


def test_batchnorm_training_mode_is_unsupported() -> None:
    model, feeds = build(C("bn", "BatchNormalization", [rand(2, 3, 4), rand(3), rand(3), rand(3), rand(3, positive=True)],
                           opset=15, outputs=3, training_mode=1))
    with pytest.raises(UnsupportedOpError, match="training_mode=1"):
        import_onnx(model, {k: v.shape for k, v in feeds.items()})


def test_conv_is_one_contraction_and_a_bias_map() -> None:
    model, feeds = build(C("c", "Conv", [rand(1, 2, 5, 5), rand(3, 2, 3, 3), rand(3)], consts=(1, 2)))
    graph = import_onnx(model, {k: v.shape for k, v in feeds.items()})
    assert [n.op.name for n in graph.nodes] == ["Conv", "add"]


def test_gqa_does_not_repeat_keys() -> None:
    """Grouped-query attention broadcasts K and V in the MatMul instead of copying them."""
    model, feeds = build(A("g", [rand(1, 4, 5, 8), rand(1, 2, 5, 8), rand(1, 2, 5, 8)]))
    graph = import_onnx(model, {k: v.shape for k, v in feeds.items()})
    names = [n.op.name for n in graph.nodes]
    assert names.count("MatMul") == 2 and "Broadcast" not in names and "Concat" not in names


def test_an_output_shape_a_stride_past_the_result_is_refused() -> None:
    """No input of this size gives it; onnxruntime refuses it as well."""
    from onnx import helper, TensorProto

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 8])
    w = helper.make_tensor("w", TensorProto.FLOAT, [1, 1, 3], [1.0, 2.0, 3.0])
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], output_shape=[8])
    m = helper.make_model(helper.make_graph([node], "g", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(TilefuseError, match=r"output_shape 8 .* is 3 past the full result 5, a stride \(1\) or more"):
        import_onnx(m)
