"""Training-time augmentations of image batches (`data.augment`), on the device, before normalisation.

Each transform draws its per-sample parameters from the client's seeded generator, so a run is
reproducible and two methods see the same augmented batches when they draw the same batches.
Images are [B, C, H, W] (uint8 or float); transforms use torchvision's functional ops.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor
from torchvision.transforms.v2 import functional as TF

from fl.core import register_augmentation


@register_augmentation("flip")
def _flip(x: Tensor, gen: torch.Generator) -> Tensor:
    """Horizontal flip with probability 1/2."""
    flip = torch.rand(len(x), generator=gen) < 0.5
    return torch.where(flip.to(x.device).view(-1, 1, 1, 1), x.flip(-1), x)


@register_augmentation("crop")
def _crop(x: Tensor, gen: torch.Generator, pad: int = 4) -> Tensor:
    """Random crop of the original size from the image zero-padded by `pad` pixels (CIFAR's standard)."""
    h, w = x.shape[-2:]
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (len(x),), generator=gen).tolist()
    dx = torch.randint(0, 2 * pad + 1, (len(x),), generator=gen).tolist()
    return torch.stack([padded[i, :, a:a + h, b:b + w] for i, (a, b) in enumerate(zip(dy, dx))])


@register_augmentation("resized_crop")
def _resized_crop(x: Tensor, gen: torch.Generator, scale=(0.9, 1.0), ratio=(3 / 4, 4 / 3)) -> Tensor:
    """RandomResizedCrop back to the input size (FedDRM: scale 0.9-1). Follows torchvision's sampling:
    area share and log-uniform aspect ratio, falling back to the whole image if the box does not fit."""
    h, w = x.shape[-2:]
    out = []
    for img in x:
        area = torch.empty(1).uniform_(*scale, generator=gen).item() * h * w
        aspect = math.exp(torch.empty(1).uniform_(math.log(ratio[0]), math.log(ratio[1]), generator=gen).item())
        ch, cw = round(math.sqrt(area / aspect)), round(math.sqrt(area * aspect))
        if not (0 < ch <= h and 0 < cw <= w):
            ch, cw = h, w
        top = int(torch.randint(0, h - ch + 1, (1,), generator=gen))
        left = int(torch.randint(0, w - cw + 1, (1,), generator=gen))
        out.append(TF.resized_crop(img, top, left, ch, cw, [h, w], antialias=True))
    return torch.stack(out)


@register_augmentation("rotate")
def _rotate(x: Tensor, gen: torch.Generator, degrees: float = 30.0) -> Tensor:
    """Rotation by a uniform angle in [-degrees, degrees] (FedBN's Office/DomainNet protocol)."""
    angles = torch.empty(len(x)).uniform_(-degrees, degrees, generator=gen).tolist()
    return torch.stack([TF.rotate(img, a) for img, a in zip(x, angles)])
