"""A CRNN text recogniser in plain torch: the model of Shi, Bai and Yao (2015) as its
reference PyTorch port has it.

Seven 3x3 convs (BatchNorm after the third, fifth and seventh, the last one 2x2 and
unpadded) with max pools that halve the height to 1 while keeping the width (the last
two pool 2x2 with stride (2, 1)); the columns become a sequence, read by two
bidirectional LSTMs, each followed by a Linear, and a log-softmax over the classes, the
input of CTC decoding. The image is one grey channel, 32 rows high; its width (and so the
number of time steps, width / 4 + 1) is dynamic, as text lines vary. The configs are in
``catalog.OCR``.
"""

from __future__ import annotations

import onnx
import torch
from torch import nn

from .catalog import OCR
from .export import CNN_OPSET, export_checked, torch_dtype
from .weights import perturb_constant_parameters, randomize_norms

SEED = 0


class BidirectionalLSTM(nn.Module):
    def __init__(self, c_in: int, hidden: int, c_out: int) -> None:
        super().__init__()
        self.rnn = nn.LSTM(c_in, hidden, bidirectional=True)
        self.embedding = nn.Linear(2 * hidden, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, B, C) in and out
        recurrent, _ = self.rnn(x)
        return self.embedding(recurrent)


class CRNN(nn.Module):
    def __init__(self, channels: tuple[int, ...], hidden: int, num_classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c_in = 1
        for i, c_out in enumerate(channels):
            k, pad = (2, 0) if i == 6 else (3, 1)
            layers.append(nn.Conv2d(c_in, c_out, k, 1, pad))
            if i in (2, 4, 6):
                layers.append(nn.BatchNorm2d(c_out))
            layers.append(nn.ReLU(inplace=True))
            if i in (0, 1):
                layers.append(nn.MaxPool2d(2, 2))
            elif i in (3, 5):
                layers.append(nn.MaxPool2d((2, 2), (2, 1), (0, 1)))
            c_in = c_out
        self.cnn = nn.Sequential(*layers)
        self.rnn = nn.Sequential(BidirectionalLSTM(c_in, hidden, hidden),
                                 BidirectionalLSTM(hidden, hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.cnn(x).squeeze(2).permute(2, 0, 1)  # (B, C, 1, T) -> (T, B, C)
        logits = self.rnn(features).permute(1, 0, 2)         # (B, T, classes)
        return torch.log_softmax(logits, dim=2)


def make_ocr(name: str, config: str) -> tuple[nn.Module, torch.Tensor]:
    """The eval-mode model and an example batch; uses torch's global RNG."""
    cfg = dict(OCR[name][config])
    batch, height, width = cfg.pop("batch"), cfg.pop("height"), cfg.pop("width")
    model = CRNN(**cfg)
    randomize_norms(model)
    perturb_constant_parameters(model)
    return model.eval(), torch.randn(batch, 1, height, width)


def build(name: str, config: str, dtype: str) -> onnx.ModelProto:
    """TorchScript exporter at opset 17 (ONNX LSTM nodes, BatchNorm kept), batch and
    width dynamic."""
    torch.manual_seed(SEED)
    module, example = make_ocr(name, config)
    module = module.to(torch_dtype(dtype))
    axes = {"x": {0: "batch", 3: "width"}, "log_probs": {0: "batch", 1: "steps"}}
    return export_checked(module, (example.to(torch_dtype(dtype)),), ["x"], ["log_probs"], axes,
                          CNN_OPSET, dtype, keep_batchnorm=True)
