"""Random but telling weights for the torch-built models.

Default initialisation leaves norm layers as identities (gamma 1, beta 0, running mean 0,
variance 1) and biases at 0, which would hide a compiler that drops, folds or misorders
them. Both functions draw from torch's global generator, so the caller's seed fixes the
values.
"""

from __future__ import annotations

import torch
from torch import nn


def randomize_norms(module: nn.Module) -> None:
    """Give every BatchNorm random affine parameters and running statistics."""
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.1)
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 1.5)


def perturb_constant_parameters(module: nn.Module) -> None:
    """Add noise to parameters initialised to a constant (norm scales 1, biases 0)."""
    with torch.no_grad():
        for p in module.parameters():
            flat = p.reshape(-1)
            if flat.numel() > 1 and bool((flat == flat[0]).all()):
                p.add_(torch.randn_like(p) * 0.1)
