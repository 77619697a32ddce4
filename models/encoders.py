"""Encoders from ``transformers`` with a task around them, random weights from a config.

- ``sbert``: a sentence-embedding model as sentence-transformers runs one: BertModel
  (no pooler), the mean of the token states over the attention mask, L2 normalisation;
  exported as one graph, so the pooling and the norm are part of the model.
- ``whisper-encoder``: Whisper's audio encoder (two Conv1d + GELU over the log-mel frames,
  the second with stride 2, sinusoidal positions, pre-LN transformer layers, a final
  LayerNorm). Whisper takes exactly ``2 * max_source_positions`` frames (3000, 30 s).

Both go through the dynamo exporter at opset 20 (LayerNormalization, Gelu) with eager
attention, as ``transformers_zoo`` does; the configs are in ``catalog.EMBEDDERS`` and
``catalog.SPEECH``. No hub access.
"""

from __future__ import annotations

import onnx
import torch
import transformers
from torch import nn

from .catalog import EMBEDDERS, SPEECH
from .export import DYNAMO_OPSET, assert_matches_torch, export_dynamo, quiet, tolerance, torch_dtype
from .spec import META_ERROR, set_metadata
from .weights import perturb_constant_parameters

SEED = 0


class SentenceEmbedder(nn.Module):
    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        tokens = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                              return_dict=True).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
        pooled = (tokens * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return nn.functional.normalize(pooled, p=2.0, dim=1)


class SpeechEncoder(nn.Module):
    def __init__(self, encoder: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_features=input_features, return_dict=True).last_hidden_state


def make_encoder(name: str, config: str, dtype: str) -> nn.Module:
    """The eval-mode wrapped encoder; same seed, same weights, every call."""
    torch.manual_seed(SEED)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # config notices, not problems
    try:
        with quiet():
            if name == "sbert":
                kwargs = {k: v for k, v in EMBEDDERS[name][config].items() if k not in ("batch", "seq")}
                cfg = transformers.BertConfig(**kwargs, attn_implementation="eager")
                model: nn.Module = SentenceEmbedder(transformers.BertModel(cfg, add_pooling_layer=False))
            else:
                kwargs = {k: v for k, v in SPEECH[name][config].items() if k != "batch"}
                cfg = transformers.WhisperConfig(**kwargs, attn_implementation="eager")
                model = SpeechEncoder(transformers.models.whisper.modeling_whisper.WhisperEncoder(cfg))
    finally:
        transformers.logging.set_verbosity(verbosity)
    perturb_constant_parameters(model)
    return model.eval().to(torch_dtype(dtype))


def example_args(name: str, config: str, dtype: str) -> tuple[torch.Tensor, ...]:
    """Tracing inputs: ids in range with a padded tail on one row, or random mel frames."""
    gen = torch.Generator().manual_seed(SEED + 1)
    if name == "sbert":
        cfg = EMBEDDERS[name][config]
        batch, seq = cfg["batch"], cfg["seq"]
        ids = torch.randint(0, cfg["vocab_size"], (batch, seq), generator=gen)
        mask = torch.ones(batch, seq, dtype=torch.int64)
        mask[-1, seq - seq // 4:] = 0
        return ids, mask
    cfg = SPEECH[name][config]
    frames = 2 * cfg["max_source_positions"]
    return (torch.randn(cfg["batch"], cfg["num_mel_bins"], frames, generator=gen).to(torch_dtype(dtype)),)


def build(name: str, config: str, dtype: str) -> onnx.ModelProto:
    module = make_encoder(name, config, dtype)
    args = example_args(name, config, dtype)
    batch = torch.export.Dim("batch", min=1, max=1024)
    if name == "sbert":
        limit = EMBEDDERS[name][config]["max_position_embeddings"]
        seq = torch.export.Dim("seq", min=2, max=limit)
        names, outputs = ["input_ids", "attention_mask"], ["sentence_embedding"]
        dynamic: tuple = ({0: batch, 1: seq}, {0: batch, 1: seq})
    else:  # the frame count is fixed by the position table
        names, outputs, dynamic = ["input_features"], ["last_hidden_state"], ({0: batch},)
    model = export_dynamo(module, args, names, outputs, dynamic, DYNAMO_OPSET)
    error = assert_matches_torch(model, module, args, names, tolerance(dtype))
    set_metadata(model, {META_ERROR: f"{error:.3g}"})
    return model
