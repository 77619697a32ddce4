"""A YOLOv8-style detector in plain torch (no ultralytics, no torchvision).

The layout is YOLOv8's: a CSP backbone of strided convs and C2f blocks ending in SPPF, a
PAN neck (nearest upsample + Concat going up, strided conv + Concat coming down) and an
anchor-free head with separate box and class branches per scale. The head decodes in the
graph, as ``yolo export format=onnx`` does: per-scale outputs reshaped and concatenated
to (batch, channels, anchors), DFL (softmax over ``reg_max`` bins, then a fixed 1x1 conv
with weights 0..reg_max-1), distances turned into xywh boxes against anchor points and
strides baked in as constants, class scores through a sigmoid. The configs are in
``catalog.DETECTORS``; like an ultralytics export, BatchNorm is folded into the convs.
"""

from __future__ import annotations

import onnx
import torch
from torch import nn

from .catalog import DETECTORS
from .export import CNN_OPSET, export_checked, torch_dtype
from .weights import randomize_norms

SEED = 0
STRIDES = (8, 16, 32)  # the P3, P4 and P5 outputs


class Conv(nn.Module):
    """Conv (no bias) -> BatchNorm -> SiLU, 'same' padding."""

    def __init__(self, c_in: int, c_out: int, k: int = 1, stride: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, k, stride, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(c_out, eps=1e-3, momentum=0.03)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    def __init__(self, c: int, shortcut: bool) -> None:
        super().__init__()
        self.cv1 = Conv(c, c, 3)
        self.cv2 = Conv(c, c, 3)
        self.add = shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    """1x1 conv, split in two halves, ``n`` bottlenecks chained on the second half, every
    intermediate concatenated and merged by a 1x1 conv."""

    def __init__(self, c_in: int, c_out: int, n: int, shortcut: bool) -> None:
        super().__init__()
        self.c = c_out // 2
        self.cv1 = Conv(c_in, 2 * self.c, 1)
        self.cv2 = Conv((2 + n) * self.c, c_out, 1)
        self.m = nn.ModuleList(Bottleneck(self.c, shortcut) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = list(self.cv1(x).chunk(2, 1))  # exports as Split
        y.extend(m(y[-1]) for m in self.m)
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: three chained 5x5 stride-1 MaxPools, concatenated."""

    def __init__(self, c_in: int, c_out: int, k: int = 5) -> None:
        super().__init__()
        hidden = c_in // 2
        self.cv1 = Conv(c_in, hidden, 1)
        self.cv2 = Conv(hidden * 4, c_out, 1)
        self.m = nn.MaxPool2d(k, 1, k // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cv1(x)
        y1 = self.m(x)
        y2 = self.m(y1)
        return self.cv2(torch.cat((x, y1, y2, self.m(y2)), 1))


class Detect(nn.Module):
    """Anchor-free head: per scale a box branch (4 * reg_max DFL bins) and a class
    branch, each two 3x3 Convs and a 1x1 Conv2d; decoded to (batch, 4 + classes, anchors)."""

    def __init__(self, num_classes: int, reg_max: int, channels: tuple[int, ...], image: int) -> None:
        super().__init__()
        self.nc, self.reg_max = num_classes, reg_max
        self.no = num_classes + 4 * reg_max
        c2 = max(16, channels[0] // 4, 4 * reg_max)
        c3 = max(channels[0], min(num_classes, 100))
        self.box = nn.ModuleList(nn.Sequential(Conv(c, c2, 3), Conv(c2, c2, 3), nn.Conv2d(c2, 4 * reg_max, 1))
                                 for c in channels)
        self.cls = nn.ModuleList(nn.Sequential(Conv(c, c3, 3), Conv(c3, c3, 3), nn.Conv2d(c3, num_classes, 1))
                                 for c in channels)
        self.dfl = nn.Conv2d(reg_max, 1, 1, bias=False).requires_grad_(False)
        with torch.no_grad():
            self.dfl.weight.copy_(torch.arange(reg_max, dtype=torch.float32).view(1, reg_max, 1, 1))
        anchors, strides = anchor_points(image)
        self.register_buffer("anchors", anchors)  # (1, 2, A): x, y of each cell's centre
        self.register_buffer("strides", strides)  # (1, 1, A)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        b = features[0].shape[0]
        outs = [torch.cat((box(x), cls(x)), 1).view(b, self.no, -1)
                for x, box, cls in zip(features, self.box, self.cls)]
        x = torch.cat(outs, 2)
        box, cls = x.split((4 * self.reg_max, self.nc), 1)
        a = box.shape[2]
        dist = self.dfl(box.view(b, 4, self.reg_max, a).transpose(2, 1).softmax(1)).view(b, 4, a)
        lt, rb = dist.chunk(2, 1)
        x1y1, x2y2 = self.anchors - lt, self.anchors + rb
        xywh = torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), 1) * self.strides
        return torch.cat((xywh, cls.sigmoid()), 1)


def anchor_points(image: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cell centres (in cells) and strides of every output position, P3 first, row-major:
    constants of the graph, since the image size is fixed."""
    points, strides = [], []
    for s in STRIDES:
        n = image // s
        y, x = torch.meshgrid(torch.arange(n) + 0.5, torch.arange(n) + 0.5, indexing="ij")
        points.append(torch.stack((x, y)).view(2, -1))
        strides.append(torch.full((n * n,), float(s)))
    return torch.cat(points, 1).unsqueeze(0), torch.cat(strides).view(1, 1, -1)


class YOLO(nn.Module):
    """YOLOv8 with channels ``widths`` (P1..P5), backbone C2f repeats ``repeats`` and
    neck C2f repeats ``neck_repeats``; ``widths=(16, 32, 64, 128, 256),
    repeats=(1, 2, 2, 1), neck_repeats=1`` is YOLOv8n."""

    def __init__(self, widths: tuple[int, ...], repeats: tuple[int, ...], neck_repeats: int,
                 num_classes: int, reg_max: int, image: int) -> None:
        super().__init__()
        w1, w2, w3, w4, w5 = widths
        r2, r3, r4, r5 = repeats
        self.stem = nn.Sequential(Conv(3, w1, 3, 2), Conv(w1, w2, 3, 2), C2f(w2, w2, r2, True))
        self.p3 = nn.Sequential(Conv(w2, w3, 3, 2), C2f(w3, w3, r3, True))
        self.p4 = nn.Sequential(Conv(w3, w4, 3, 2), C2f(w4, w4, r4, True))
        self.p5 = nn.Sequential(Conv(w4, w5, 3, 2), C2f(w5, w5, r5, True), SPPF(w5, w5))
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        n = neck_repeats
        self.top_down4 = C2f(w5 + w4, w4, n, False)
        self.top_down3 = C2f(w4 + w3, w3, n, False)
        self.down3 = Conv(w3, w3, 3, 2)
        self.bottom_up4 = C2f(w3 + w4, w4, n, False)
        self.down4 = Conv(w4, w4, 3, 2)
        self.bottom_up5 = C2f(w4 + w5, w5, n, False)
        self.detect = Detect(num_classes, reg_max, (w3, w4, w5), image)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        c3 = self.p3(self.stem(images))
        c4 = self.p4(c3)
        c5 = self.p5(c4)
        t4 = self.top_down4(torch.cat((self.up(c5), c4), 1))
        out3 = self.top_down3(torch.cat((self.up(t4), c3), 1))
        out4 = self.bottom_up4(torch.cat((self.down3(out3), t4), 1))
        out5 = self.bottom_up5(torch.cat((self.down4(out4), c5), 1))
        return self.detect([out3, out4, out5])


def make_detector(name: str, config: str) -> tuple[nn.Module, torch.Tensor]:
    """The eval-mode detector and an example batch; uses torch's global RNG."""
    cfg = dict(DETECTORS[name][config])
    batch = cfg.pop("batch")
    model = YOLO(**cfg)
    randomize_norms(model)
    return model.eval(), torch.randn(batch, 3, cfg["image"], cfg["image"])


def build(name: str, config: str, dtype: str) -> onnx.ModelProto:
    """TorchScript exporter at opset 17, BatchNorm folded into the convs as ultralytics'
    export does, batch dynamic."""
    torch.manual_seed(SEED)
    module, example = make_detector(name, config)
    module = module.to(torch_dtype(dtype))
    axes = {"images": {0: "batch"}, "output0": {0: "batch"}}
    return export_checked(module, (example.to(torch_dtype(dtype)),), ["images"], ["output0"], axes,
                          CNN_OPSET, dtype)
