"""The later zoo families are the models their descriptions name.

Each tiny export holds its family's characteristic ops (read from the ONNX file, which
the zoo-wide tests build and run anyway), and each real config has the parameter count of
the model it stands for, counted on torch's meta device (no weights made, nothing
exported).
"""
from __future__ import annotations

from collections import Counter

import onnx
import pytest
from onnx import helper

import models
from models import catalog

LATER = ["yolo", "convnext", "efficientnet", "crnn", "whisper-encoder", "sbert"]


def _whisper_tiny_encoder() -> int:
    """openai/whisper-tiny's encoder from its published dims: 80 mel bins, width 384,
    1500 positions, 4 layers with a 1536 MLP, k projection without bias."""
    d, ffn = 384, 1536
    layer = (4 * d * d + 3 * d) + (d * ffn + ffn + ffn * d + d) + 2 * 2 * d
    return (80 * d * 3 + d) + (d * d * 3 + d) + 1500 * d + 4 * layer + 2 * d


# (count, relative tolerance)
PUBLISHED_PARAMETERS = {
    "yolo": (3_157_200, 0),               # ultralytics' YOLOv8n summary
    "convnext": (28_589_128, 0),          # torchvision convnext_tiny
    "efficientnet": (5_288_548, 0),       # torchvision efficientnet_b0
    "crnn": (8_300_000, 0.01),            # "8.3M" in Shi, Bai and Yao (2015)
    "sbert": (22_713_216 - (384 * 384 + 384), 0),  # all-MiniLM-L6-v2, without its unused pooler
    "whisper-encoder": (_whisper_tiny_encoder(), 0),
}


def _graph(name: str, zoo_cache) -> tuple[onnx.GraphProto, Counter]:
    graph = onnx.load(str(models.build(name, "tiny", "float32", cache_dir=zoo_cache))).graph
    return graph, Counter(n.op_type for n in graph.node)


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _weights(graph: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    return {t.name: tuple(t.dims) for t in graph.initializer}


def _depthwise_kernels(graph: onnx.GraphProto) -> Counter:
    """Kernel sizes of the depthwise convs (one input channel per group)."""
    weights = _weights(graph)
    out = Counter()
    for n in graph.node:
        w = weights.get(n.input[1]) if n.op_type == "Conv" else None
        if w is not None and w[1] == 1 and _attrs(n).get("group", 1) == w[0] > 1:
            out[w[2]] += 1
    return out


def test_every_later_family_is_in_the_zoo_with_both_configs():
    for name in LATER:
        spec = models.ZOO[name]
        assert spec.configs == ("tiny", "real") and spec.runs_in_ort and spec.description
        assert name in catalog.DESCRIPTIONS


def test_yolo_export_is_a_decoded_yolov8(zoo_cache):
    graph, ops = _graph("yolo", zoo_cache)
    cfg = catalog.DETECTORS["yolo"]["tiny"]
    assert {"Conv", "Sigmoid", "Split", "Concat", "Resize", "MaxPool", "Softmax", "Reshape", "Transpose"} <= set(ops)
    assert "BatchNormalization" not in ops  # folded, as ultralytics exports
    pools = [_attrs(n) for n in graph.node if n.op_type == "MaxPool"]
    assert len(pools) == 3 and all(p["kernel_shape"] == [5, 5] and p["strides"] == [1, 1] for p in pools)  # SPPF
    assert ops["Resize"] == 2 and all(_attrs(n)["mode"] == b"nearest" for n in graph.node if n.op_type == "Resize")
    # the DFL's fixed 1x1 conv: reg_max bins -> 1 distance
    assert any(dims == (1, cfg["reg_max"], 1, 1) for dims in _weights(graph).values())


def test_convnext_export_has_depthwise_7x7_and_channel_norms(zoo_cache):
    graph, ops = _graph("convnext", zoo_cache)
    depths = catalog.CONVNETS["convnext"]["tiny"]["depths"]
    assert _depthwise_kernels(graph) == {7: sum(depths)}
    assert ops["LayerNormalization"] == sum(depths) + 1  # one per block, one before the head
    assert ops["ReduceMean"] >= 2 * len(depths)  # the stem's and downsamplers' norms, written out
    assert ops["Erf"] == sum(depths) and "BatchNormalization" not in ops


def test_efficientnet_export_has_mbconv_with_squeeze_excitation(zoo_cache):
    graph, ops = _graph("efficientnet", zoo_cache)
    blocks = catalog.CONVNETS["efficientnet"]["tiny"]["blocks"]
    assert ops["GlobalAveragePool"] == sum(b[4] for b in blocks) + 1  # one SE per MBConv, the head
    assert set(_depthwise_kernels(graph)) == {b[1] for b in blocks} == {3, 5}
    assert ops["BatchNormalization"] > 0 and ops["Sigmoid"] >= ops["GlobalAveragePool"]


def test_crnn_export_reads_columns_with_two_bidirectional_lstms(zoo_cache):
    graph, ops = _graph("crnn", zoo_cache)
    lstms = [_attrs(n) for n in graph.node if n.op_type == "LSTM"]
    assert len(lstms) == 2 and all(a["direction"] == b"bidirectional" for a in lstms)
    assert sum(_attrs(n)["strides"] == [2, 1] for n in graph.node if n.op_type == "MaxPool") == 2
    assert ops["LogSoftmax"] == 1
    width = graph.input[0].type.tensor_type.shape.dim[3]
    assert width.dim_param == "width"  # text lines vary in width


def test_whisper_encoder_export_has_its_conv1d_front(zoo_cache):
    graph, ops = _graph("whisper-encoder", zoo_cache)
    cfg = catalog.SPEECH["whisper-encoder"]["tiny"]
    convs = [_attrs(n) for n in graph.node if n.op_type == "Conv"]
    assert [(c["kernel_shape"], c.get("strides", [1])) for c in convs] == [([3], [1]), ([3], [2])]
    assert ops["LayerNormalization"] == 2 * cfg["encoder_layers"] + 1 and ops["Gelu"] == 2 + cfg["encoder_layers"]
    frames = [d.dim_value for d in graph.input[0].type.tensor_type.shape.dim][1:]
    assert frames == [cfg["num_mel_bins"], 2 * cfg["max_source_positions"]]


def test_sbert_export_pools_and_normalises_in_the_graph(zoo_cache):
    graph, ops = _graph("sbert", zoo_cache)
    layers = catalog.EMBEDDERS["sbert"]["tiny"]["num_hidden_layers"]
    assert ops["ReduceL2"] == 1 and ops["ReduceSum"] >= 2  # the L2 norm; the masked sum and the count
    assert ops["LayerNormalization"] == 2 * layers + 1 and "Tanh" not in ops  # no pooler
    assert [o.name for o in graph.output] == ["sentence_embedding"]


def test_bert_qdq_export_is_a_static_qdq_quantization(zoo_cache):
    """onnxruntime's quantize_static output: every MatMul by a weight reads a
    DequantizeLinear of uint8 activations and one of constant int8 weights."""
    graph, ops = _graph("bert-qdq", zoo_cache)
    layers = catalog.TRANSFORMERS["bert"]["tiny"]["num_hidden_layers"]
    weights = {t.name: t.data_type for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    by_weight = [n for n in graph.node if n.op_type == "MatMul"
                 and producer.get(n.input[1]) is not None and producer[n.input[1]].input[0] in weights]
    assert len(by_weight) == 6 * layers  # Q, K, V, the output projection, the two MLP products
    for n in by_weight:
        x, w = (producer[i] for i in n.input)
        assert x.op_type == w.op_type == "DequantizeLinear"
        assert weights[w.input[0]] == onnx.TensorProto.INT8
        assert producer[x.input[0]].op_type == "QuantizeLinear"
    assert ops["QuantizeLinear"] >= len(by_weight) and "MatMulInteger" not in ops


@pytest.mark.parametrize("name", LATER)
def test_real_config_has_the_published_parameter_count(name):
    torch = pytest.importorskip("torch")
    with torch.device("meta"):  # shapes only: no weights drawn
        module = _real_module(name)
    count, tolerance = PUBLISHED_PARAMETERS[name]
    assert abs(sum(p.numel() for p in module.parameters()) - count) <= tolerance * count


def _real_module(name: str):
    if name == "yolo":
        from models.detector import YOLO

        return YOLO(**_without(catalog.DETECTORS[name]["real"], "batch"))
    if name in catalog.CONVNETS:
        from models.convnets import ConvNeXt, EfficientNet

        cls = ConvNeXt if name == "convnext" else EfficientNet
        return cls(**_without(catalog.CONVNETS[name]["real"], "batch", "image"))
    if name == "crnn":
        from models.ocr import CRNN

        return CRNN(**_without(catalog.OCR[name]["real"], "batch", "height", "width"))
    import transformers

    if name == "sbert":
        config = transformers.BertConfig(**_without(catalog.EMBEDDERS[name]["real"], "batch", "seq"))
        return transformers.BertModel(config, add_pooling_layer=False)
    config = transformers.WhisperConfig(**_without(catalog.SPEECH[name]["real"], "batch"))
    return transformers.models.whisper.modeling_whisper.WhisperEncoder(config)


def _without(cfg: dict, *keys: str) -> dict:
    return {k: v for k, v in cfg.items() if k not in keys}
