"""The torch-built models: their configs, shapes and specs, without importing torch.

Importing torch and transformers takes seconds, and most callers only want a cached
file, a shapes table or the list of names. So this module is plain data, and each
spec's builder imports its torch module (``transformers_zoo`` or ``cnn``) on first call.
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

DESCRIPTIONS = {
    "bert": "BertModel: post-LN encoder, erf GELU, padding mask",
    "gpt2": "GPT2LMHeadModel: pre-LN decoder, tanh GELU, Conv1D as Gemm, causal mask, tied LM head",
    "llama": "LlamaModel: RMSNorm, SwiGLU, rotary embedding, GQA, causal mask",
    "vit": "ViTModel: patch Conv, [CLS] token, pre-LN encoder, pooler",
    "resnet": "ResNet with bottleneck blocks (real: the ResNet-50 layout), BatchNorm kept",
    "mobilenetv2": "MobileNetV2: inverted residuals, depthwise Conv, ReLU6 as Clip",
    "unet": "two-level U-Net: MaxPool down, ConvTranspose and bilinear Resize up, skip Concat",
    "mlp": "MLP classifier: Gemm/ReLU, Gemm/tanh-GELU spelled out, Gemm, Softmax",
}

# The modules each builder's output depends on; the cache hashes their source.
TRANSFORMER_SOURCES = ("models.transformers_zoo", "models.export", "models.catalog")
CNN_SOURCES = ("models.cnn", "models.export", "models.catalog")


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


def specs() -> list[ModelSpec]:
    """Specs of the transformers (dynamo and legacy variants) and the CNNs/MLP."""
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
    return out
