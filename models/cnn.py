"""Plain-torch vision models and an MLP, written out here (no torchvision).

``make_cnn(name, config)`` returns an eval-mode module and the example input used to
trace it; the configs are in ``catalog.CNNS``. Weights come from torch's default
initialisers under ``SEED``; ``randomize_norms`` then gives the BatchNorm layers
non-trivial statistics so that a compiler that mishandles them (folding, epsilon, affine
order) produces visibly wrong numbers.
"""

from __future__ import annotations

import onnx
import torch
from torch import nn

from .catalog import CNNS, MOBILENETV2_BLOCKS
from .export import CNN_OPSET, export_checked, torch_dtype
from .weights import randomize_norms

SEED = 0


def conv_bn_act(c_in: int, c_out: int, k: int, stride: int = 1, groups: int = 1,
                act: type[nn.Module] | None = nn.ReLU) -> nn.Sequential:
    """Conv (no bias, 'same' padding for odd k) -> BatchNorm -> optional activation."""
    layers: list[nn.Module] = [
        nn.Conv2d(c_in, c_out, k, stride=stride, padding=k // 2, groups=groups, bias=False),
        nn.BatchNorm2d(c_out),
    ]
    if act is not None:
        layers.append(act(inplace=True))
    return nn.Sequential(*layers)


# --------------------------------------------------------------------------- ResNet


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck: 1x1 reduce, 3x3 (carries the stride), 1x1 expand x4."""

    expansion = 4

    def __init__(self, c_in: int, width: int, stride: int) -> None:
        super().__init__()
        c_out = width * self.expansion
        self.body = nn.Sequential(
            conv_bn_act(c_in, width, 1),
            conv_bn_act(width, width, 3, stride=stride),
            conv_bn_act(width, c_out, 1, act=None),
        )
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = conv_bn_act(c_in, c_out, 1, stride=stride, act=None)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet with bottleneck blocks; ``layers=(3, 4, 6, 3), base=64`` is ResNet-50."""

    def __init__(self, layers: tuple[int, ...], base: int, num_classes: int) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            conv_bn_act(3, base, 7, stride=2),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        stages: list[nn.Module] = []
        c_in = base
        for i, n in enumerate(layers):
            width = base * 2**i
            for j in range(n):
                stride = 2 if (i > 0 and j == 0) else 1
                stages.append(Bottleneck(c_in, width, stride))
                c_in = width * Bottleneck.expansion
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c_in, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.stages(self.stem(x)))
        return self.fc(torch.flatten(x, 1))


# --------------------------------------------------------------------------- MobileNetV2


def make_divisible(v: float, divisor: int = 8) -> int:
    """Round channels to a multiple of ``divisor`` without dropping more than 10%."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


class InvertedResidual(nn.Module):
    """Expand 1x1 (ReLU6) -> depthwise 3x3 (ReLU6) -> linear 1x1 projection, with a
    residual add when the shapes match."""

    def __init__(self, c_in: int, c_out: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = c_in * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(conv_bn_act(c_in, hidden, 1, act=nn.ReLU6))
        layers += [
            conv_bn_act(hidden, hidden, 3, stride=stride, groups=hidden, act=nn.ReLU6),
            conv_bn_act(hidden, c_out, 1, act=None),
        ]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


class MobileNetV2(nn.Module):
    def __init__(self, width: float, num_classes: int,
                 blocks: tuple[tuple[int, int, int, int], ...] = MOBILENETV2_BLOCKS) -> None:
        super().__init__()
        c_in = make_divisible(32 * width)
        c_last = make_divisible(1280 * max(1.0, width))
        layers: list[nn.Module] = [conv_bn_act(3, c_in, 3, stride=2, act=nn.ReLU6)]
        for t, c, n, s in blocks:
            c_out = make_divisible(c * width)
            for i in range(n):
                layers.append(InvertedResidual(c_in, c_out, s if i == 0 else 1, t))
                c_in = c_out
        layers.append(conv_bn_act(c_in, c_last, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(c_last, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x).mean(dim=(2, 3))  # exports as ReduceMean, not GlobalAveragePool
        return self.classifier(x)


# --------------------------------------------------------------------------- U-Net


def double_conv(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(conv_bn_act(c_in, c_out, 3), conv_bn_act(c_out, c_out, 3))


class UNet(nn.Module):
    """Two-level U-Net. The deep level upsamples with ConvTranspose, the shallow one with
    a bilinear Resize followed by a 1x1 conv, so both upsampling styles appear."""

    def __init__(self, c_in: int, base: int, num_classes: int) -> None:
        super().__init__()
        self.enc1 = double_conv(c_in, base)
        self.enc2 = double_conv(base, 2 * base)
        self.bottom = double_conv(2 * base, 4 * base)
        self.pool = nn.MaxPool2d(2)
        self.up2 = nn.ConvTranspose2d(4 * base, 2 * base, kernel_size=2, stride=2)
        self.dec2 = double_conv(4 * base, 2 * base)
        self.up1 = nn.Sequential(
            nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False),
            nn.Conv2d(2 * base, base, 1),
        )
        self.dec1 = double_conv(2 * base, base)
        self.head = nn.Conv2d(base, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s1 = self.enc1(x)
        s2 = self.enc2(self.pool(s1))
        b = self.bottom(self.pool(s2))
        d2 = self.dec2(torch.cat([self.up2(b), s2], dim=1))
        d1 = self.dec1(torch.cat([self.up1(d2), s1], dim=1))
        return self.head(d1)


# --------------------------------------------------------------------------- MLP


class MLP(nn.Module):
    """Classifier MLP: Linear/ReLU, Linear/GELU(tanh), Linear, Softmax."""

    def __init__(self, d_in: int, hidden: int, num_classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_in, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.GELU(approximate="tanh"),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.net(x), dim=-1)


# --------------------------------------------------------------------------- construction


def make_cnn(name: str, config: str) -> tuple[nn.Module, torch.Tensor]:
    """The eval-mode module ``name`` at ``config`` and an example input for tracing.

    Uses torch's global RNG; seed it first for reproducible weights.
    """
    cfg = dict(CNNS[name][config])
    batch = cfg.pop("batch")
    if name == "mlp":
        model: nn.Module = MLP(**cfg)
        example = torch.randn(batch, cfg["d_in"])
    else:
        image = cfg.pop("image")
        model = {"resnet": ResNet, "mobilenetv2": MobileNetV2, "unet": UNet}[name](**cfg)
        c_in = cfg.get("c_in", 3)
        example = torch.randn(batch, c_in, image, image)
    randomize_norms(model)
    return model.eval(), example


# --------------------------------------------------------------------------- builders


def build(name: str, config: str, dtype: str) -> onnx.ModelProto:
    """Export with the TorchScript exporter at opset 17, BatchNorm kept, batch dynamic.

    The dynamo exporter's optimiser folds BatchNorm into Conv with no switch to stop it;
    real CNN exports mostly keep BatchNormalization nodes, and folding them is the
    compiler's job, so the TorchScript exporter is used here.
    """
    torch.manual_seed(SEED)
    module, example = make_cnn(name, config)
    module = module.to(torch_dtype(dtype))
    axes = {"x": {0: "batch"}, "y": {0: "batch"}}
    return export_checked(module, (example.to(torch_dtype(dtype)),), ["x"], ["y"], axes, CNN_OPSET,
                          dtype, keep_batchnorm=True)
