"""Training-time augmentations of image batches (`data.augment`), on the device, before normalisation.

Each transform draws its per-sample parameters from the client's seeded generator, so a run is
reproducible and two methods see the same augmented batches when they draw the same batches.
Images are [B, C, H, W] (uint8 or float); transforms use torchvision's functional ops.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

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


def resized_crop_params(height: int, width: int, gen: torch.Generator, scale=(0.9, 1.0),
                        ratio=(3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """(top, left, h, w) of a RandomResizedCrop box, drawn as torchvision's RandomResizedCrop.get_params draws it
    (up to 10 tries of an area share and a log-uniform aspect ratio, then the centre crop), from `gen`."""
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1], generator=gen).item()
        aspect_ratio = torch.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1], generator=gen)).item()
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, size=(1,), generator=gen))
            left = int(torch.randint(0, width - w + 1, size=(1,), generator=gen))
            return top, left, h, w
    in_ratio = width / height  # no box fitted: the centre crop, clamped to the aspect ratio range
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


@register_augmentation("resized_crop")
def _resized_crop(x: Tensor, gen: torch.Generator, scale=(0.9, 1.0), ratio=(3 / 4, 4 / 3)) -> Tensor:
    """RandomResizedCrop back to the input size (FedDRM: scale 0.9-1), each image its own box."""
    from torchvision.transforms.v2 import functional as TF  # torchvision loads with the first batch, not the CLI

    h, w = x.shape[-2:]
    return torch.stack([TF.resized_crop(img, *resized_crop_params(h, w, gen, scale, ratio), [h, w], antialias=True)
                        for img in x])


@register_augmentation("rotate")
def _rotate(x: Tensor, gen: torch.Generator, degrees: float = 30.0) -> Tensor:
    """Rotation by a uniform angle in [-degrees, degrees] (FedBN's Office/DomainNet protocol)."""
    from torchvision.transforms.v2 import functional as TF  # torchvision loads with the first batch, not the CLI

    angles = torch.empty(len(x)).uniform_(-degrees, degrees, generator=gen).tolist()
    return torch.stack([TF.rotate(img, a) for img, a in zip(x, angles)])
