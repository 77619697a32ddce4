"""The torch-built models: their configs, shapes and specs, without importing torch.

Importing torch and transformers takes seconds, and most callers only want a cached
file, a shapes table or the list of names. So this module is plain data, and each
spec's builder imports its torch module (``transformers_zoo``, ``cnn``, ``detector``,
``convnets``, ``ocr`` or ``encoders``) on first call.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import onnx

from .spec import ModelSpec, Shape

# MobileNetV2's (expansion t, channels c, repeats n, first stride s), from the paper.
MOBILENETV2_BLOCKS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                      (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))

# Per model and config: the transformers config fields, plus the batch and sequence
# length the shapes table binds. "real" configs are the published sizes, except LLaMA,
# which is TinyLlama-1.1B's width (2048, GQA with 32/4 heads, SwiGLU 5632) cut to 4 layers.
TRANSFORMERS: dict[str, dict[str, dict]] = {
    "bert": {
        "tiny": dict(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64, batch=2, seq=16),
        "real": dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12,
                     num_attention_heads=12, intermediate_size=3072,
                     max_position_embeddings=512, batch=1, seq=128),
    },
    "gpt2": {
        "tiny": dict(vocab_size=100, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                     batch=2, seq=16),
        "real": dict(vocab_size=50257, n_embd=768, n_layer=12, n_head=12, n_positions=1024,
                     batch=1, seq=128),
    },
    "llama": {
        "tiny": dict(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, intermediate_size=176, max_position_embeddings=64,
                     batch=2, seq=16),
        "real": dict(vocab_size=32000, hidden_size=2048, num_hidden_layers=4,
                     num_attention_heads=32, num_key_value_heads=4, intermediate_size=5632,
                     max_position_embeddings=2048, batch=1, seq=128),
    },
    "vit": {
        "tiny": dict(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=128, batch=2),
        "real": dict(image_size=224, patch_size=16, hidden_size=768, num_hidden_layers=12,
                     num_attention_heads=12, intermediate_size=3072, batch=1),
    },
}

TRANSFORMER_OUTPUTS = {
    "bert": ("last_hidden_state", "pooler_output"),
    "gpt2": ("logits",),
    "llama": ("last_hidden_state",),
    "vit": ("last_hidden_state", "pooler_output"),
}

# Per model and config: constructor arguments, plus the batch and image size.
CNNS: dict[str, dict[str, dict]] = {
    "resnet": {
        "tiny": dict(layers=(1, 1, 1, 1), base=8, num_classes=10, image=32, batch=2),
        "real": dict(layers=(3, 4, 6, 3), base=64, num_classes=1000, image=224, batch=1),
    },
    "mobilenetv2": {
        "tiny": dict(width=0.25, num_classes=10, image=32, batch=2,
                     blocks=((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 2, 2), (6, 64, 1, 2))),
        "real": dict(width=1.0, num_classes=1000, image=224, batch=1, blocks=MOBILENETV2_BLOCKS),
    },
    "unet": {
        "tiny": dict(c_in=3, base=8, num_classes=2, image=32, batch=2),
    },
    "mlp": {
        "tiny": dict(d_in=64, hidden=128, num_classes=10, batch=4),
    },
}

# EfficientNet-B0's MBConv stages, (expansion, kernel, first stride, channels, repeats),
# from the paper (and torchvision's efficientnet_b0).
EFFICIENTNET_B0_BLOCKS = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
                          (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))

# The later families, each written by hand in torch or built from a transformers config,
# per model and config: the builder's arguments plus the batch (and image or sequence
# size) the shapes table binds. Every "real" config is the published size:
# - yolo: YOLOv8n (width 0.25, depth 0.33; 3.2M parameters) at 640x640, 8400 anchors;
# - convnext: ConvNeXt-T (28.6M) at 224; efficientnet: EfficientNet-B0 (5.3M) at 224;
# - crnn: the CRNN of Shi et al. (VGG-style convs, two BiLSTM layers of 256) on a 32x320
#   grey text line, 37 classes (blank, digits, letters), 81 time steps;
# - whisper-encoder: whisper-tiny's encoder (384 wide, 4 layers, 6 heads) on 80 mel bins
#   x 3000 frames (30 s);
# - sbert: all-MiniLM-L6-v2's encoder (384 wide, 6 layers, 12 heads) at sequence 128.
DETECTORS: dict[str, dict[str, dict]] = {
    "yolo": {
        "tiny": dict(widths=(8, 16, 16, 32, 32), repeats=(1, 1, 1, 1), neck_repeats=1,
                     num_classes=3, reg_max=4, image=64, batch=2),
        "real": dict(widths=(16, 32, 64, 128, 256), repeats=(1, 2, 2, 1), neck_repeats=1,
                     num_classes=80, reg_max=16, image=640, batch=1),
    },
}
CONVNETS: dict[str, dict[str, dict]] = {
    "convnext": {
        "tiny": dict(depths=(1, 1, 1, 1), dims=(8, 16, 32, 64), num_classes=10, image=64, batch=2),
        "real": dict(depths=(3, 3, 9, 3), dims=(96, 192, 384, 768), num_classes=1000, image=224,
                     batch=1),
    },
    "efficientnet": {
        "tiny": dict(stem=8, blocks=((1, 3, 1, 8, 1), (6, 3, 2, 16, 1), (6, 5, 2, 16, 2),
                                     (6, 3, 2, 24, 1)),
                     head=64, num_classes=10, image=32, batch=2),
        "real": dict(stem=32, blocks=EFFICIENTNET_B0_BLOCKS, head=1280, num_classes=1000, image=224,
                     batch=1),
    },
}
OCR: dict[str, dict[str, dict]] = {
    "crnn": {
        "tiny": dict(channels=(4, 8, 16, 16, 32, 32, 32), hidden=8, num_classes=11, height=32,
                     width=32, batch=2),
        "real": dict(channels=(64, 128, 256, 256, 512, 512, 512), hidden=256, num_classes=37,
                     height=32, width=320, batch=1),
    },
}
SPEECH: dict[str, dict[str, dict]] = {
    "whisper-encoder": {
        "tiny": dict(num_mel_bins=16, d_model=64, encoder_layers=2, encoder_attention_heads=4,
                     encoder_ffn_dim=128, max_source_positions=32, batch=2),
        "real": dict(num_mel_bins=80, d_model=384, encoder_layers=4, encoder_attention_heads=6,
                     encoder_ffn_dim=1536, max_source_positions=1500, batch=1),
    },
}
EMBEDDERS: dict[str, dict[str, dict]] = {
    "sbert": {
        "tiny": dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64, batch=2, seq=16),
        "real": dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6,
                     num_attention_heads=12, intermediate_size=1536,
                     max_position_embeddings=512, batch=1, seq=128),
    },
}

DESCRIPTIONS = {
    "bert": "BertModel: post-LN encoder, erf GELU, padding mask",
    "gpt2": "GPT2LMHeadModel: pre-LN decoder, tanh GELU, Conv1D as Gemm, causal mask, tied LM head",
    "llama": "LlamaModel: RMSNorm, SwiGLU, rotary embedding, GQA, causal mask",
    "vit": "ViTModel: patch Conv, [CLS] token, pre-LN encoder, pooler",
    "resnet": "ResNet with bottleneck blocks (real: the ResNet-50 layout), BatchNorm kept",
    "mobilenetv2": "MobileNetV2: inverted residuals, depthwise Conv, ReLU6 as Clip",
    "unet": "two-level U-Net: MaxPool down, ConvTranspose and bilinear Resize up, skip Concat",
    "mlp": "MLP classifier: Gemm/ReLU, Gemm/tanh-GELU spelled out, Gemm, Softmax",
    "yolo": "YOLOv8-style detector: C2f blocks, SPPF, upsample + Concat neck, box/class "
            "branches per scale, DFL and box decoding in the graph, BatchNorm folded",
    "convnext": "ConvNeXt: depthwise 7x7 Conv, LayerNorm over channels, inverted bottleneck "
                "MLP with GELU, layer scale",
    "efficientnet": "EfficientNet: MBConv with squeeze-excitation, SiLU, depthwise 3x3/5x5, "
                    "BatchNorm kept",
    "crnn": "CRNN text recogniser: VGG-style Conv/BatchNorm/MaxPool stack, two BiLSTMs, "
            "LogSoftmax over classes, width dynamic",
    "whisper-encoder": "Whisper's audio encoder: two Conv1d + GELU over log-mel frames, "
                       "sinusoidal positions, pre-LN encoder",
    "sbert": "sentence embedding: BertModel, mean pooling over the attention mask, L2 norm",
}
# Quantized variants of transformers: (zoo name, the float model it is quantized from).
QUANTIZED = (("bert-qdq", "bert"),)

# The modules each builder's output depends on; the cache hashes their source.
TRANSFORMER_SOURCES = ("models.transformers_zoo", "models.export", "models.catalog",
                       "models.weights")
CNN_SOURCES = ("models.cnn", "models.export", "models.catalog", "models.weights")


def lazy(module: str, function: str, *args: str) -> Callable[[str, str], onnx.ModelProto]:
    """A builder that imports ``module`` only when called, then calls
    ``function(*args, config, dtype)``."""
    def build(config: str, dtype: str) -> onnx.ModelProto:
        return getattr(importlib.import_module(module), function)(*args, config, dtype)
    return build


def transformer_tables(name: str) -> tuple[dict, dict, dict]:
    """(input shapes, output shapes, integer input ranges), each keyed by config."""
    shapes: dict[str, dict[str, Shape]] = {}
    outputs: dict[str, dict[str, Shape]] = {}
    ranges: dict[str, dict[str, tuple[int, int]]] = {}
    for config, cfg in TRANSFORMERS[name].items():
        b = cfg["batch"]
        if name == "vit":
            size, hidden = cfg["image_size"], cfg["hidden_size"]
            tokens = (size // cfg["patch_size"]) ** 2 + 1  # patches and [CLS]
            shapes[config] = {"pixel_values": (b, 3, size, size)}
            outputs[config] = {"last_hidden_state": (b, tokens, hidden),
                               "pooler_output": (b, hidden)}
            continue
        s = cfg["seq"]
        hidden = cfg.get("hidden_size", cfg.get("n_embd"))
        shapes[config] = {"input_ids": (b, s), "attention_mask": (b, s)}
        ranges[config] = {"input_ids": (0, cfg["vocab_size"])}
        outputs[config] = {
            "bert": {"last_hidden_state": (b, s, hidden), "pooler_output": (b, hidden)},
            "gpt2": {"logits": (b, s, cfg["vocab_size"])},
            "llama": {"last_hidden_state": (b, s, hidden)},
        }[name]
    return shapes, outputs, ranges


def cnn_input_shape(name: str, config: str) -> Shape:
    cfg = CNNS[name][config]
    if name == "mlp":
        return (cfg["batch"], cfg["d_in"])
    return (cfg["batch"], cfg.get("c_in", 3), cfg["image"], cfg["image"])


def cnn_output_shape(name: str, config: str) -> Shape:
    cfg = CNNS[name][config]
    if name == "unet":
        return (cfg["batch"], cfg["num_classes"], cfg["image"], cfg["image"])
    return (cfg["batch"], cfg["num_classes"])


def family_tables(name: str, cfg: dict) -> tuple[dict[str, Shape], dict[str, Shape]]:
    """(input shapes, output shapes) of one of the later families' models at ``cfg``."""
    b = cfg["batch"]
    if name == "yolo":
        size, anchors = cfg["image"], sum((cfg["image"] // s) ** 2 for s in (8, 16, 32))
        return ({"images": (b, 3, size, size)},
                {"output0": (b, 4 + cfg["num_classes"], anchors)})
    if name in CONVNETS:
        return {"x": (b, 3, cfg["image"], cfg["image"])}, {"y": (b, cfg["num_classes"])}
    if name == "crnn":
        return ({"x": (b, 1, cfg["height"], cfg["width"])},
                {"log_probs": (b, cfg["width"] // 4 + 1, cfg["num_classes"])})
    if name == "whisper-encoder":
        positions = cfg["max_source_positions"]
        return ({"input_features": (b, cfg["num_mel_bins"], 2 * positions)},
                {"last_hidden_state": (b, positions, cfg["d_model"])})
    if name == "sbert":
        s = cfg["seq"]
        return ({"input_ids": (b, s), "attention_mask": (b, s)},
                {"sentence_embedding": (b, cfg["hidden_size"])})
    raise KeyError(name)


# The later families: (family, table, builder module, exporter style).
FAMILY_TABLES = (
    ("detector", DETECTORS, "models.detector", "TorchScript exporter, opset 17"),
    ("cnn", CONVNETS, "models.convnets", "TorchScript exporter, opset 17"),
    ("ocr", OCR, "models.ocr", "TorchScript exporter, opset 17"),
    ("speech", SPEECH, "models.encoders", "dynamo exporter, opset 20"),
    ("embedding", EMBEDDERS, "models.encoders", "dynamo exporter, opset 20"),
)


def specs() -> list[ModelSpec]:
    """Specs of the transformers (dynamo and legacy variants), the CNNs/MLP, the later
    families (detector, ConvNeXt/EfficientNet, OCR, speech, sentence embedding) and the
    quantized (QDQ) transformers."""
    out: list[ModelSpec] = []
    for name in TRANSFORMERS:
        shapes, outputs, ranges = transformer_tables(name)
        for suffix, function, style in (
                ("", "build_dynamo", "dynamo exporter, opset 20"),
                ("-legacy", "build_legacy", "TorchScript exporter, opset 14, norms spelled out")):
            out.append(ModelSpec(
                name=name + suffix, family="transformer", configs=tuple(TRANSFORMERS[name]),
                shapes=shapes, output_shapes=outputs, input_ranges=ranges,
                builder=lazy("models.transformers_zoo", function, name),
                sources=TRANSFORMER_SOURCES, description=f"{DESCRIPTIONS[name]} ({style})"))
    for name, configs in CNNS.items():
        out.append(ModelSpec(
            name=name, family="mlp" if name == "mlp" else "cnn", configs=tuple(configs),
            shapes={c: {"x": cnn_input_shape(name, c)} for c in configs},
            output_shapes={c: {"y": cnn_output_shape(name, c)} for c in configs},
            builder=lazy("models.cnn", "build", name), sources=CNN_SOURCES,
            description=f"{DESCRIPTIONS[name]} (TorchScript exporter, opset 17)"))
    for family, table, module, style in FAMILY_TABLES:
        for name, configs in table.items():
            tables = {c: family_tables(name, cfg) for c, cfg in configs.items()}
            ranges = {c: {"input_ids": (0, cfg["vocab_size"])} for c, cfg in configs.items()
                      if "vocab_size" in cfg}
            sources = (module, "models.export", "models.catalog", "models.weights")
            out.append(ModelSpec(
                name=name, family=family, configs=tuple(configs),
                shapes={c: t[0] for c, t in tables.items()},
                output_shapes={c: t[1] for c, t in tables.items()}, input_ranges=ranges,
                builder=lazy(module, "build", name),
                sources=sources + (("models.cnn",) if module == "models.convnets" else ()),
                description=f"{DESCRIPTIONS[name]} ({style})"))
    for name, source in QUANTIZED:
        shapes, outputs, ranges = transformer_tables(source)
        out.append(ModelSpec(
            name=name, family="quantized", configs=tuple(TRANSFORMERS[source]), shapes=shapes,
            output_shapes=outputs, input_ranges=ranges, builder=lazy("models.quantized", "build", source),
            sources=("models.quantized", "models.inputs", *TRANSFORMER_SOURCES), libraries=("onnxruntime",),
            dtypes=("float32",),
            description=f"{DESCRIPTIONS[source]}, quantized by onnxruntime's quantize_static to QDQ "
                        "(uint8 activations, int8 weights, per-tensor scales; dynamo exporter, opset 20)"))
    return out
