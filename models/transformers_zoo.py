"""BERT, GPT-2, LLaMA and ViT from ``transformers``, random weights from a config.

Each model is built twice from the same seed, hence the same weights:

- ``<name>``: the dynamo exporter at opset 20 (LayerNormalization, Gelu ops);
- ``<name>-legacy``: the TorchScript exporter at opset 14, the older style with
  LayerNorm spelled out (ReduceMean/Sub/Pow/Sqrt/Div, Mul/Add affine), Erf GELU and
  Shape/Gather/Concat/Unsqueeze arithmetic feeding Reshape.

So the two variants of one model must give the same outputs; the tests hold them to it.
Attention is ``eager`` (explicit MatMul/Softmax), not sdpa, for a stable graph.
No hub access: configs are written out in ``catalog.TRANSFORMERS`` and weights come
from the models' own initialisers under ``SEED``.
"""

from __future__ import annotations

import onnx
import torch
import transformers
from torch import nn

from .catalog import TRANSFORMER_OUTPUTS, TRANSFORMERS
from .export import (DYNAMO_OPSET, LEGACY_OPSET, assert_matches_torch, export_dynamo,
                     export_torchscript, quiet, tolerance, torch_dtype)
from .spec import META_ERROR, set_metadata
from .weights import perturb_constant_parameters

SEED = 0


# ------------------------------------------------------------------- torch modules


class TextWrapper(nn.Module):
    """Calls a text model with keywords and returns a tuple of tensors.

    The TorchScript tracer passes arguments positionally, which transformers 5 models
    reject ("multiple values for argument 'use_cache'"); this wrapper also pins
    ``return_dict`` so both exporters see the same outputs.
    """

    def __init__(self, model: nn.Module, outputs: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.outputs = outputs

    def forward(self, input_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        return tuple(out[k] for k in self.outputs)


class VisionWrapper(nn.Module):
    def __init__(self, model: nn.Module, outputs: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.outputs = outputs

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(pixel_values=pixel_values, return_dict=True)
        return tuple(out[k] for k in self.outputs)


def hf_config(name: str, config: str) -> transformers.PretrainedConfig:
    kwargs = {k: v for k, v in TRANSFORMERS[name][config].items() if k not in ("batch", "seq")}
    common = dict(attn_implementation="eager")
    if name == "bert":
        return transformers.BertConfig(**kwargs, **common)
    if name == "gpt2":
        # Special tokens inside the vocabulary: the default 50256 is out of range for tiny.
        last = kwargs["vocab_size"] - 1
        return transformers.GPT2Config(**kwargs, **common, use_cache=False,
                                       bos_token_id=last, eos_token_id=last)
    if name == "llama":
        return transformers.LlamaConfig(**kwargs, **common, use_cache=False,
                                        bos_token_id=0, eos_token_id=1)
    if name == "vit":
        return transformers.ViTConfig(**kwargs, **common)
    raise KeyError(name)


def make_module(name: str, config: str, dtype: str) -> nn.Module:
    """The eval-mode, wrapped transformers model; same seed, same weights, every call."""
    torch.manual_seed(SEED)
    cls = {"bert": transformers.BertModel, "gpt2": transformers.GPT2LMHeadModel,
           "llama": transformers.LlamaModel, "vit": transformers.ViTModel}[name]
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # config notices, not problems
    try:
        with quiet():
            model = cls(hf_config(name, config))
    finally:
        transformers.logging.set_verbosity(verbosity)
    perturb_constant_parameters(model)
    wrapper_cls = VisionWrapper if name == "vit" else TextWrapper
    return wrapper_cls(model, TRANSFORMER_OUTPUTS[name]).eval().to(torch_dtype(dtype))


def example_args(name: str, config: str, dtype: str) -> tuple[torch.Tensor, ...]:
    """Tracing inputs: ids in range with a padded tail on one row, or random pixels."""
    cfg = TRANSFORMERS[name][config]
    gen = torch.Generator().manual_seed(SEED + 1)
    if name == "vit":
        size = cfg["image_size"]
        pixels = torch.randn(cfg["batch"], 3, size, size, generator=gen)
        return (pixels.to(torch_dtype(dtype)),)
    batch, seq = cfg["batch"], cfg["seq"]
    ids = torch.randint(0, cfg["vocab_size"], (batch, seq), generator=gen)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    mask[-1, seq - seq // 4:] = 0
    return ids, mask


def input_names(name: str) -> tuple[str, ...]:
    return ("pixel_values",) if name == "vit" else ("input_ids", "attention_mask")


def dynamic_axes(name: str) -> dict[str, dict[int, str]]:
    """The TorchScript exporter's dynamic axes, outputs included, so that output dims
    get the same symbolic names as the inputs rather than generated ones."""
    if name == "vit":
        return {"pixel_values": {0: "batch"}, "last_hidden_state": {0: "batch"},
                "pooler_output": {0: "batch"}}
    axes = {n: {0: "batch", 1: "seq"} for n in (*input_names(name), *TRANSFORMER_OUTPUTS[name])}
    if "pooler_output" in axes:
        axes["pooler_output"] = {0: "batch"}
    return axes


# ------------------------------------------------------------------- builders


def build_dynamo(name: str, config: str, dtype: str) -> onnx.ModelProto:
    module = make_module(name, config, dtype)
    args = example_args(name, config, dtype)
    names = input_names(name)
    batch = torch.export.Dim("batch", min=1, max=1024)
    if name == "vit":  # the position embeddings fix the image size
        dynamic: tuple = ({0: batch},)
    else:
        cfg = TRANSFORMERS[name][config]
        limit = cfg.get("max_position_embeddings", cfg.get("n_positions"))
        seq = torch.export.Dim("seq", min=2, max=limit)
        dynamic = ({0: batch, 1: seq}, {0: batch, 1: seq})
    model = export_dynamo(module, args, names, TRANSFORMER_OUTPUTS[name], dynamic, DYNAMO_OPSET)
    record_error(model, assert_matches_torch(model, module, args, names, tolerance(dtype)))
    return model


def build_legacy(name: str, config: str, dtype: str) -> onnx.ModelProto:
    module = make_module(name, config, dtype)
    args = example_args(name, config, dtype)
    names = input_names(name)
    axes = dynamic_axes(name)
    model = export_torchscript(module, args, names, TRANSFORMER_OUTPUTS[name], axes, LEGACY_OPSET)
    fused = {n.op_type for n in model.graph.node} & {"LayerNormalization", "Gelu"}
    if fused:  # the point of the variant is the spelled-out form
        raise AssertionError(f"{name}-legacy: exporter emitted fused ops {sorted(fused)}")
    record_error(model, assert_matches_torch(model, module, args, names, tolerance(dtype)))
    return model


def record_error(model: onnx.ModelProto, error: float) -> None:
    """Store the checked error against torch in the model's metadata."""
    set_metadata(model, {META_ERROR: f"{error:.3g}"})
