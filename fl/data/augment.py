"""Training-time augmentations of image batches (`data.augment`), on the device, before normalisation.

Each transform draws its per-sample parameters from the client's seeded generator, so a run is
reproducible and two methods see the same augmented batches when they draw the same batches.
Images are [B, C, H, W] (uint8 or float). The parameters are drawn on the CPU (the generator's device) and
sent with a non-blocking copy; the pixels are then moved for the whole batch at once (one gather, one
sampling grid), so a batch costs a fixed number of kernels and never waits for the GPU.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from fl.core import register_augmentation


@register_augmentation("flip")
def _flip(x: Tensor, gen: torch.Generator) -> Tensor:
    """Horizontal flip with probability 1/2."""
    flip = torch.rand(len(x), generator=gen) < 0.5
    return torch.where(flip.to(x.device, non_blocking=True).view(-1, 1, 1, 1), x.flip(-1), x)


def _windows(start: Tensor, length: int, device) -> Tensor:
    """[B, length] positions start_b, ..., start_b + length - 1 on `device` (start: CPU int64 [B])."""
    return (start.view(-1, 1) + torch.arange(length)).to(device, non_blocking=True)


def _take(x: Tensor, rows: Tensor, cols: Tensor) -> Tensor:
    """x[b, :, rows[b, i], cols[b, j]] as [B, C, len(rows[b]), len(cols[b])]."""
    b, c = x.shape[:2]
    x = x.gather(2, rows.view(b, 1, -1, 1).expand(b, c, rows.shape[1], x.shape[3]))
    return x.gather(3, cols.view(b, 1, 1, -1).expand(b, c, rows.shape[1], cols.shape[1]))


@register_augmentation("crop")
def _crop(x: Tensor, gen: torch.Generator, pad: int = 4) -> Tensor:
    """Random crop of the original size from the image zero-padded by `pad` pixels (CIFAR's standard)."""
    h, w = x.shape[-2:]
    padded = F.pad(x, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (len(x),), generator=gen)
    dx = torch.randint(0, 2 * pad + 1, (len(x),), generator=gen)
    return _take(padded, _windows(dy, h, x.device), _windows(dx, w, x.device))


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


def _linear_taps(start: Tensor, size: Tensor, out: int, dtype: torch.dtype, device) -> tuple[Tensor, Tensor, Tensor]:
    """Bilinear resampling (align_corners=False, as torch's interpolate) of the windows [start_b, start_b + size_b)
    to `out` pixels: for each output pixel the two source positions and the weight of the second, [B, out] each,
    computed in `dtype`. Positions before the window's first pixel centre take that pixel (interpolate's clamp)."""
    start, size = start.to(device, non_blocking=True), size.to(device, non_blocking=True)
    scale = size.to(dtype).view(-1, 1) / out
    src = ((torch.arange(out, dtype=dtype, device=device) + 0.5) * scale - 0.5).clamp(min=0)
    lo = src.floor()
    frac = src - lo
    lo = lo.long()
    hi = torch.minimum(lo + 1, size.view(-1, 1) - 1)
    return start.view(-1, 1) + lo, start.view(-1, 1) + hi, frac


@register_augmentation("resized_crop")
def _resized_crop(x: Tensor, gen: torch.Generator, scale=(0.9, 1.0), ratio=(3 / 4, 4 / 3)) -> Tensor:
    """RandomResizedCrop back to the input size (FedDRM: scale 0.9-1), each image its own box, bilinear. A box never
    exceeds the image, so resizing only enlarges and antialiasing (torchvision's default) changes nothing; the batch
    is resampled in float32, as torchvision resizes uint8 images on a GPU (on a CPU its uint8 kernel rounds
    fixed-point weights: up to one grey level apart on a few pixels)."""
    h, w = x.shape[-2:]
    boxes = torch.tensor([resized_crop_params(h, w, gen, scale, ratio) for _ in range(len(x))],
                         dtype=torch.int64).view(-1, 4)  # the draws stay on the CPU generator, image after image
    top, left, box_h, box_w = boxes.unbind(1)
    img = x if x.is_floating_point() else x.float()
    dtype = torch.float64 if img.dtype == torch.float64 else torch.float32  # interpolate's precision
    rows0, rows1, wy = _linear_taps(top, box_h, h, dtype, x.device)
    cols0, cols1, wx = _linear_taps(left, box_w, w, dtype, x.device)
    wy, wx = wy.to(img.dtype).view(len(x), 1, h, 1), wx.to(img.dtype).view(len(x), 1, 1, w)
    top_row, bottom_row = _take(img, rows0, cols0), _take(img, rows1, cols0)
    top_next, bottom_next = _take(img, rows0, cols1), _take(img, rows1, cols1)
    out = (top_row * (1 - wx) + top_next * wx) * (1 - wy) + (bottom_row * (1 - wx) + bottom_next * wx) * wy
    return out if x.is_floating_point() else out.round_().clamp_(0, 255).to(x.dtype)


@register_augmentation("rotate")
def _rotate(x: Tensor, gen: torch.Generator, degrees: float = 30.0) -> Tensor:
    """Rotation by a uniform angle in [-degrees, degrees] about the centre, nearest neighbour, zeros outside:
    torchvision's `rotate`, with one sampling grid for the batch (its per-image call builds each matrix with a
    blocking copy to the device)."""
    b, h, w = len(x), *x.shape[-2:]
    dtype = x.dtype if x.is_floating_point() else torch.float32
    angles = torch.empty(b).uniform_(-degrees, degrees, generator=gen)
    rot = torch.deg2rad(-torch.remainder(angles.double(), 360))  # torchvision's inverse matrix, angle in [0, 360)
    cos, sin, zero = rot.cos(), rot.sin(), torch.zeros_like(rot)
    theta = torch.stack([torch.stack([cos, sin, zero], 1), torch.stack([-sin, cos, zero], 1)], 1).to(dtype)
    # the grid of pixel centres (x, y, 1), centred, times theta^T scaled to [-1, 1] (torchvision's _affine_grid)
    scaled = (theta.transpose(1, 2) / torch.tensor([0.5 * w, 0.5 * h], dtype=dtype)).to(x.device, non_blocking=True)
    base = torch.empty(1, h, w, 3, dtype=dtype, device=x.device)
    base[..., 0].copy_(torch.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, steps=w, device=x.device))
    base[..., 1].copy_(torch.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, steps=h, device=x.device).unsqueeze_(-1))
    base[..., 2].fill_(1)
    grid = base.view(1, h * w, 3).expand(b, -1, -1).bmm(scaled).view(b, h, w, 2)
    out = F.grid_sample(x if x.is_floating_point() else x.to(dtype), grid, mode="nearest", padding_mode="zeros",
                        align_corners=False)
    return out if x.is_floating_point() else out.round_().to(x.dtype)
