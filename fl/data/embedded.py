"""The embedded dataset: procedurally generated images, no download, built in well under a second.

Each class is a prototype image made of a class-specific oriented grating and a few coloured Gaussian
blobs; a sample is its class prototype randomly shifted, rescaled in contrast and corrupted by pixel
noise and a random distractor blob. The dataset depends only on its shape parameters (a fixed
generation seed), so every run and every method sees the same pool; the client split uses the run's seed.
Images are stored as uint8 in [0, 255] (pixel value (v + 3) / 6 of the generated v), normalised per batch.

The same bytes on every machine: the draws are float64 (torch's uniform and normal draws in float64 are the same
numbers under every CPU capability), and so is all the arithmetic. Vectorised sin / exp kernels differ from the scalar
ones by an ulp or two (about 1e-16 relative), so a pixel could only change if its value * 255 fell within about 1e-13
of a rounding boundary; tests/data/test_generated_bitwise.py checks the bytes under torch's scalar kernels
(ATEN_CPU_CAPABILITY=default) against the machine's own and against pinned hashes.
"""
from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path

import torch
from torch import Tensor

GENERATION_SEED = 20261121
F64 = torch.float64


def _blob(size: int, cy: Tensor, cx: Tensor, sigma: Tensor) -> Tensor:
    grid = torch.arange(size, dtype=F64)
    gy = (grid.view(1, -1, 1) - cy.view(-1, 1, 1)) ** 2
    gx = (grid.view(1, 1, -1) - cx.view(-1, 1, 1)) ** 2
    return torch.exp(-(gy + gx) / (2 * sigma.view(-1, 1, 1) ** 2))


def prototypes(num_classes: int, channels: int, size: int, gen: torch.Generator) -> Tensor:
    """[K, C, S, S] class prototypes in roughly [-1, 1]."""
    grid = torch.arange(size, dtype=F64)
    yy, xx = torch.meshgrid(grid, grid, indexing="ij")
    protos = []
    for _ in range(num_classes):
        angle = torch.rand(1, generator=gen, dtype=F64) * torch.pi
        freq = 0.15 + 0.35 * torch.rand(1, generator=gen, dtype=F64)
        grating = torch.sin(freq * (xx * torch.cos(angle) + yy * torch.sin(angle)) * 2)
        colour = torch.rand(channels, 1, 1, generator=gen, dtype=F64) * 2 - 1
        img = 0.5 * grating * colour
        for _ in range(3):
            cy, cx = torch.rand(2, generator=gen, dtype=F64) * (size - 1)
            sigma = size * (0.08 + 0.12 * torch.rand(1, generator=gen, dtype=F64))
            b = _blob(size, cy.view(1), cx.view(1), sigma)[0]
            img = img + (torch.rand(channels, 1, 1, generator=gen, dtype=F64) * 2 - 1) * b
        protos.append(img)
    return torch.stack(protos)


def labels(num_classes: int, samples_per_class: int) -> Tensor:
    """The labels of `generate`'s images: class by class."""
    return torch.arange(num_classes).repeat_interleave(samples_per_class)


def generate(num_classes: int, samples_per_class: int, channels: int, size: int, noise: float) -> tuple[Tensor, Tensor]:
    gen = torch.Generator().manual_seed(GENERATION_SEED)
    protos = prototypes(num_classes, channels, size, gen)
    n = num_classes * samples_per_class
    y = labels(num_classes, samples_per_class)
    x = protos[y].clone()
    # random shift by up to size/8 pixels (cyclic), sample by sample via gather on a shifted grid
    max_shift = max(1, size // 8)
    sy = torch.randint(-max_shift, max_shift + 1, (n,), generator=gen)
    sx = torch.randint(-max_shift, max_shift + 1, (n,), generator=gen)
    rows = (torch.arange(size).view(1, -1) - sy.view(-1, 1)) % size
    cols = (torch.arange(size).view(1, -1) - sx.view(-1, 1)) % size
    x = x[torch.arange(n).view(-1, 1, 1), :, rows.view(n, size, 1), cols.view(n, 1, size)].permute(0, 3, 1, 2)
    x = x * (0.6 + 0.8 * torch.rand(n, 1, 1, 1, generator=gen, dtype=F64))
    cy, cx = (torch.rand(n, generator=gen, dtype=F64) * (size - 1) for _ in range(2))
    distractor = _blob(size, cy, cx, torch.full((n,), size * 0.15, dtype=F64))
    x = x + distractor.unsqueeze(1) * (torch.rand(n, channels, 1, 1, generator=gen, dtype=F64) * 2 - 1)
    x = x + noise * torch.randn(x.shape, generator=gen, dtype=F64)
    # stored as 8-bit images, like the real datasets, so pixel-space client transforms apply to it too
    x = ((x + 3.0) / 6.0 * 255).round().clamp(0, 255).to(torch.uint8)
    return x.contiguous(), y


def cache_key(num_classes: int, samples_per_class: int, channels: int, size: int, noise: float) -> str:
    """Names the generated images (bump its version when `generate` changes)."""
    return f"v3-{num_classes}-{samples_per_class}-{channels}-{size}-{noise}"


def load_or_generate(root: str, num_classes: int, samples_per_class: int, channels: int, size: int,
                     noise: float) -> tuple[Tensor, Tensor]:
    """Generate once and cache under <root>/embedded/ (written atomically: several processes may race)."""
    key = cache_key(num_classes, samples_per_class, channels, size, noise)
    path = Path(root) / "embedded" / f"{hashlib.sha1(key.encode()).hexdigest()[:12]}.pt"
    if path.is_file():
        n = num_classes * samples_per_class
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
            x, y = blob["x"], blob["y"]
            if x.dtype == torch.uint8 and x.shape == (n, channels, size, size) and y.shape == (n,):
                return x, y
            reason = "not the expected images"
        except Exception as err:  # truncated or overwritten; the data is generated, so regenerating is the fix
            reason = f"unreadable: {type(err).__name__}"
        warnings.warn(f"embedded data cache {path} is {reason}; regenerating it", stacklevel=2)
    x, y = generate(num_classes, samples_per_class, channels, size, noise)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        torch.save({"x": x, "y": y, "key": key}, tmp)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only root only costs the regeneration next time
    return x, y
