"""ConvNeXt and EfficientNet in plain torch (no torchvision), as their reference code has them.

- ConvNeXt: a 4x4 stride-4 patchify stem, stages of blocks (depthwise 7x7 conv, LayerNorm
  over channels in channels-last layout, Linear 4x expansion, GELU, Linear back, layer
  scale, residual add) with LayerNorm + 2x2 stride-2 convs between the stages, global mean,
  LayerNorm and a Linear classifier. The channels-first LayerNorm of the stem and the
  downsampling layers is written out (mean, variance, divide), as in the paper's code.
- EfficientNet: MBConv blocks (1x1 expansion, depthwise 3x3 or 5x5, squeeze-excitation,
  1x1 projection, residual add where the shapes match), SiLU throughout, BatchNorm kept.

The configs are in ``catalog.CONVNETS``. Parameters that start constant (norm scales,
biases, layer scales) are drawn at random so that none is a no-op.
"""

from __future__ import annotations

import onnx
import torch
from torch import nn

from .catalog import CONVNETS
from .cnn import make_divisible
from .export import CNN_OPSET, export_checked, torch_dtype
from .weights import perturb_constant_parameters, randomize_norms

SEED = 0


# --------------------------------------------------------------------------- ConvNeXt


class ChannelsFirstLayerNorm(nn.Module):
    """LayerNorm over dim 1 of an NCHW tensor, spelled out as ConvNeXt's code does."""

    def __init__(self, channels: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.eps)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int, layer_scale: float = 1e-6) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(layer_scale * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(x).permute(0, 2, 3, 1)  # NCHW -> NHWC
        y = self.pwconv2(self.act(self.pwconv1(self.norm(y))))
        return x + (self.gamma * y).permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    """``depths=(3, 3, 9, 3), dims=(96, 192, 384, 768)`` is ConvNeXt-T."""

    def __init__(self, depths: tuple[int, ...], dims: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, dims[0], 4, stride=4), ChannelsFirstLayerNorm(dims[0])]
        for i, (depth, dim) in enumerate(zip(depths, dims)):
            if i > 0:
                layers += [ChannelsFirstLayerNorm(dims[i - 1]), nn.Conv2d(dims[i - 1], dim, 2, stride=2)]
            layers += [ConvNeXtBlock(dim) for _ in range(depth)]
        self.features = nn.Sequential(*layers)
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.head = nn.Linear(dims[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.features(x).mean((-2, -1))))


# --------------------------------------------------------------------------- EfficientNet


def conv_bn_silu(c_in: int, c_out: int, k: int, stride: int = 1, groups: int = 1,
                 act: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, k, stride, k // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(c_out, eps=1e-3)]
    if act:
        layers.append(nn.SiLU())
    return nn.Sequential(*layers)


class SqueezeExcitation(nn.Module):
    """Global average pool -> 1x1 conv (SiLU) -> 1x1 conv (sigmoid) -> channel scale."""

    def __init__(self, channels: int, squeezed: int) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)  # exports as GlobalAveragePool
        self.fc1 = nn.Conv2d(channels, squeezed, 1)
        self.fc2 = nn.Conv2d(squeezed, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.sigmoid(self.fc2(nn.functional.silu(self.fc1(self.pool(x)))))
        return x * scale


class MBConv(nn.Module):
    def __init__(self, c_in: int, c_out: int, expand: int, k: int, stride: int) -> None:
        super().__init__()
        hidden = c_in * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(conv_bn_silu(c_in, hidden, 1))
        layers += [conv_bn_silu(hidden, hidden, k, stride, groups=hidden),
                   SqueezeExcitation(hidden, max(1, c_in // 4)),
                   conv_bn_silu(hidden, c_out, 1, act=False)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        return x + y if self.residual else y  # stochastic depth is the identity in eval


class EfficientNet(nn.Module):
    """``stem=32, blocks=EFFICIENTNET_B0_BLOCKS, head=1280`` is EfficientNet-B0."""

    def __init__(self, stem: int, blocks: tuple[tuple[int, int, int, int, int], ...], head: int,
                 num_classes: int) -> None:
        super().__init__()
        c_in = make_divisible(stem)
        layers: list[nn.Module] = [conv_bn_silu(3, c_in, 3, stride=2)]
        for expand, k, stride, channels, repeats in blocks:
            c_out = make_divisible(channels)
            for i in range(repeats):
                layers.append(MBConv(c_in, c_out, expand, k, stride if i == 0 else 1))
                c_in = c_out
        layers.append(conv_bn_silu(c_in, head, 1))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(head, num_classes)  # dropout before it: identity in eval

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


# --------------------------------------------------------------------------- builders


def make_convnet(name: str, config: str) -> tuple[nn.Module, torch.Tensor]:
    """The eval-mode model and an example batch; uses torch's global RNG."""
    cfg = dict(CONVNETS[name][config])
    batch, image = cfg.pop("batch"), cfg.pop("image")
    model = {"convnext": ConvNeXt, "efficientnet": EfficientNet}[name](**cfg)
    randomize_norms(model)
    perturb_constant_parameters(model)
    if name == "convnext":  # layer scales start at 1e-6: blocks would barely count
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, ConvNeXtBlock):
                    m.gamma.uniform_(0.1, 0.5)
    return model.eval(), torch.randn(batch, 3, image, image)


def build(name: str, config: str, dtype: str) -> onnx.ModelProto:
    """TorchScript exporter at opset 17 (LayerNormalization for nn.LayerNorm, BatchNorm
    kept), batch dynamic."""
    torch.manual_seed(SEED)
    module, example = make_convnet(name, config)
    module = module.to(torch_dtype(dtype))
    axes = {"x": {0: "batch"}, "y": {0: "batch"}}
    return export_checked(module, (example.to(torch_dtype(dtype)),), ["x"], ["y"], axes, CNN_OPSET,
                          dtype, keep_batchnorm=True)
