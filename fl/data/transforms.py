"""Per-client covariate shift as pure tensor functions: uint8 images [N, 3, H, W] in, uint8 out.

Two families, each reproducing one paper's protocol:

* `feddrm_color`: FedDRM's deterministic colour transform per client (saturation, hue, gamma and,
  in the scalability pool, 2-bit posterize), FedDRM Sec. 3.1 and App. F.1-F.2, official `utils/dataset.py`.
* `cifar_s`: pFedFDA's CIFAR10-S / CIFAR100-S, one Hendrycks corruption at one severity per client for
  the first 50 clients, pFedFDA Sec. 5.1 and App. C.1.1, with the CIFAR parameters of Hendrycks'
  `make_cifar_c.py` (not the ImageNet-scale ones of the `imagecorruptions` package).

Both use torch / torchvision ops (and PIL, which torchvision ships with, where the reference used
PIL: JPEG, and reading the frost images), so that a client's shifted images can be computed
once when the federation is built and cached as uint8 (safe for FedDRM: its only random op, the crop,
is applied afterwards). Randomness (noise, blur angle, fog, frost crop) comes from a generator seeded by
`derive_seed(seed, 0, client, "corruption")`, so the shifted data depend only on (seed, client, images).
"""
from __future__ import annotations

import functools
import io
import math
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as nnf
from PIL import Image
from torch import Tensor

from fl.core import derive_seed


def _check_images(x: Tensor) -> None:
    if x.dtype != torch.uint8 or x.dim() != 4 or x.shape[1] != 3:
        raise ValueError(f"expected uint8 images [N, 3, H, W], got {x.dtype} {tuple(x.shape)}")


def _check_client(client: int, num_clients: int) -> None:
    if not 0 <= client < num_clients:
        raise ValueError(f"client {client} is outside 0..{num_clients - 1}")


# --------------------------------------------------------------------------------------------------
# FedDRM (Sec. 3.1, App. F.1-F.2)
# --------------------------------------------------------------------------------------------------

# (gamma levels, hue levels, saturation levels); client i takes bit 0, 1, 2 of i for gamma, hue, saturation.
FEDDRM_LEVELS = {
    "low": ((0.9, 1.1), (-0.01, 0.01), (0.9, 1.1)),
    "mid": ((0.75, 1.25), (-0.05, 0.05), (0.7, 1.3)),
    "high": ((0.6, 1.4), (-0.1, 0.1), (0.5, 1.5)),  # the main setting (m = 8)
}
# Scalability pool (m in {8, 16, 24, 32}): base-3 digits of i, then posterize on (i // 27) % 2.
FEDDRM_POOL = ((0.6, 1.0, 1.4), (-0.15, 0.0, 0.15), (0.4, 1.0, 1.6))
FEDDRM_POSTERIZE_BITS = 2


def feddrm_params(client: int, num_clients: int, level: str = "auto") -> tuple[float, float, float, bool]:
    """(gamma, hue shift, saturation factor, posterize?) of one client.

    `level` is "low" | "mid" | "high" (the 2^3 bit grid of the main setting and the intensity ablation,
    Sec. 3.1 and App. F.2.2) or "pool" (the 3^3 x 2 scalability pool, App. F.2.1). "auto" [our choice, not the
    paper's] picks "high" for up to 8 clients and "pool" above, since the bit grid only has 8 distinct
    transforms (the official code silently repeats them: bits above 2 are ignored).
    """
    _check_client(client, num_clients)
    if level == "auto":
        level = "high" if num_clients <= 8 else "pool"
    if level == "pool":
        g, h, s = FEDDRM_POOL
        return g[client % 3], h[(client // 3) % 3], s[(client // 9) % 3], (client // 27) % 2 == 1
    if level not in FEDDRM_LEVELS:
        raise ValueError(f"unknown FedDRM level {level!r}: expected auto, low, mid, high or pool")
    g, h, s = FEDDRM_LEVELS[level]
    return g[client & 1], h[(client >> 1) & 1], s[(client >> 2) & 1], False


def feddrm_color(x: Tensor, client: int, num_clients: int, level: str = "auto", backend: str = "tensor",
                 chunk: int = 4096) -> Tensor:
    """Saturation -> hue -> gamma [-> posterize], the official order (ordering matters).

    Deterministic. The official pipeline's RandomResizedCrop(32, scale=(0.9, 1)) comes first and is
    stochastic, so it is not part of this function: apply it on the fly to the cached colour-shifted
    images (or shift each batch after its crop: `feddrm_color_by_owner`).

    The official code runs torchvision's functional ops on CIFAR's PIL images. backend "tensor" (default) computes
    the same ops batched in torch on any device, with PIL's integer and float32/float64 arithmetic step by step
    (`_pil_saturation`, `_pil_hue`, `_pil_gamma_table`, `_POSTERIZE_MASK`): it equals backend "pil" (PIL itself,
    about 0.5 ms per 32x32 image on a CPU) bit for bit (tested). One deliberate exception to the official code in
    both: ops with identity parameters are skipped, so client 13 of the pool is the identity (gamma 1, hue 0,
    saturation 1, App. F.2.1); the official code still runs PIL's 8-bit HSV round trip at hue 0, which moves about a
    third of the pixels by 0.5 grey levels on average (max 6).
    """
    import torchvision.transforms.functional as TF  # torchvision loads with the data, not with the CLI

    _check_images(x)
    _check_client(client, num_clients)
    if backend == "tensor":
        owner = torch.full((len(x),), client, dtype=torch.int64, device=x.device)
        parts = [feddrm_color_by_owner(x[i:i + chunk], owner[i:i + chunk], num_clients, level)
                 for i in range(0, len(x), chunk)]  # chunks bound the float64 intermediates
        return torch.cat(parts) if parts else x.clone()
    if backend != "pil":
        raise ValueError(f"unknown backend {backend!r}: expected pil or tensor")
    gamma, hue, sat, posterize = feddrm_params(client, num_clients, level)
    ops = [(TF.adjust_saturation, sat, 1.0), (TF.adjust_hue, hue, 0.0), (TF.adjust_gamma, gamma, 1.0),
           (TF.posterize, FEDDRM_POSTERIZE_BITS if posterize else 8, 8)]
    ops = [(fn, value) for fn, value, identity in ops if value != identity]
    if not ops:
        return x
    out = torch.empty_like(x, device="cpu")
    for i, img in enumerate(x.cpu()):
        pil = TF.to_pil_image(img)
        for fn, value in ops:
            pil = fn(pil, value)
        out[i] = TF.pil_to_tensor(pil)
    return out.to(x.device)


def feddrm_color_by_owner(x: Tensor, owner: Tensor, num_clients: int, level: str = "auto") -> Tensor:
    """Each image shifted by its owner's `feddrm_color`, the whole batch at once on its device (a training batch of
    pooled clients, shifted after its crop): per-image parameters are looked up by owner, so nothing waits for the
    host. Equal to `feddrm_color` image by image, bit for bit."""
    _check_images(x)
    table = _feddrm_table(num_clients, level, x.device)
    owner = owner.to(x.device, non_blocking=True)
    per_image = lambda t: t[owner].view(-1, 1, 1, 1)  # noqa: E731
    x = torch.where(per_image(table.sat_on), _pil_saturation(x, per_image(table.sat)), x)
    x = torch.where(per_image(table.hue_on), _pil_hue(x, per_image(table.hue_shift)), x)
    x = table.gamma.view(-1)[owner.view(-1, 1, 1, 1) * 256 + x.long()]  # identity tables where gamma is 1
    return x & per_image(table.mask)


@dataclass(frozen=True)
class _FedDRMTable:
    """Every client's colour shift as tensors indexed by client (one lookup per batch on the device)."""
    sat: Tensor  # float32 saturation factor
    sat_on: Tensor  # bool: saturation is not the identity
    hue_shift: Tensor  # int32, added to PIL's 8-bit hue modulo 256
    hue_on: Tensor
    gamma: Tensor  # uint8 [M, 256] lookup table
    mask: Tensor  # uint8 posterize mask (255: none)


@functools.lru_cache(maxsize=16)
def _feddrm_table(num_clients: int, level: str, device: torch.device) -> _FedDRMTable:
    params = [feddrm_params(c, num_clients, level) for c in range(num_clients)]
    gamma = [_pil_gamma_table(g) if g != 1.0 else list(range(256)) for g, _, _, _ in params]
    # torchvision's PIL adjust_hue adds np.int32(hue * 255) to the uint8 hue, wrapping around
    shift = [int(np.int32(h * 255)) % 256 for _, h, _, _ in params]
    return _FedDRMTable(sat=torch.tensor([s for _, _, s, _ in params], dtype=torch.float32, device=device),
                        sat_on=torch.tensor([s != 1.0 for _, _, s, _ in params], device=device),
                        hue_shift=torch.tensor(shift, dtype=torch.int32, device=device),
                        hue_on=torch.tensor([h != 0.0 for _, h, _, _ in params], device=device),
                        gamma=torch.tensor(gamma, dtype=torch.uint8, device=device),
                        mask=torch.tensor([_POSTERIZE_MASK if p else 255 for _, _, _, p in params], dtype=torch.uint8,
                                          device=device))


_POSTERIZE_MASK = ~(2 ** (8 - FEDDRM_POSTERIZE_BITS) - 1) & 255  # PIL's ImageOps.posterize keeps the top bits


def _pil_gamma_table(gamma: float) -> list[int]:
    """torchvision's PIL adjust_gamma lookup table (gain 1), value for value."""
    return [int((255 + 1 - 1e-3) * pow(v / 255.0, gamma)) for v in range(256)]


def _pil_saturation(x: Tensor, factor: Tensor) -> Tensor:
    """PIL's ImageEnhance.Color: Image.blend of the greyscale image ("L": ITU-R 601 in 16-bit fixed point) and the
    image with a float32 factor, truncated (and clipped when extrapolating)."""
    r, g, b = x.int().unbind(1)
    grey = ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16).unsqueeze(1).float()
    return (grey + factor * (x.float() - grey)).clamp(0, 255).trunc().to(torch.uint8)


def _c_round(v: Tensor) -> Tensor:
    """C's round() of non-negative values: halves away from zero (torch.round rounds them to even)."""
    down = v.floor()
    return torch.where(v - down >= 0.5, down + 1, down)


def _pil_hue(x: Tensor, shift: Tensor) -> Tensor:
    """torchvision's PIL adjust_hue: PIL's RGB -> HSV (8-bit h, s, v), h + shift modulo 256, HSV -> RGB, with the
    float32 and float64 steps of Pillow's Convert.c (rgb2hsv_row, hsv2rgb) reproduced as C evaluates them."""
    c = x.int()
    r, g, b = c.unbind(1)
    maxc, minc = c.amax(1), c.amin(1)
    grey = maxc == minc
    cr = torch.where(grey, 1, maxc - minc).float()
    sat = cr / maxc.clamp(min=1).float()
    rc, gc, bc = ((maxc - r).float() / cr, (maxc - g).float() / cr, (maxc - b).float() / cr)
    h = torch.where(r == maxc, bc - gc, torch.where(g == maxc, (2.0 + rc.double() - bc.double()).float(),
                                                    (4.0 + gc.double() - rc.double()).float()))
    h = torch.fmod(h.double() / 6.0 + 1.0, 1.0).float()
    hue = torch.where(grey, 0, (h.double() * 255.0).trunc().clamp(0, 255).int())
    s = torch.where(grey, 0, (sat.double() * 255.0).trunc().clamp(0, 255).int())
    hue = (hue + shift.view(-1, 1, 1)) % 256

    sector = hue.double() * 6.0 / 255.0
    i = sector.floor()
    f = (sector - i).float()
    fs = (s.double() / 255.0).float()
    v = maxc.double()  # PIL's v: the max of r, g, b
    p = _c_round(v * (1.0 - fs.double())).clamp(0, 255).to(torch.uint8)
    q = _c_round(v * (1.0 - (fs * f).double())).clamp(0, 255).to(torch.uint8)
    t = _c_round(v * (1.0 - fs.double() * (1.0 - f.double()))).clamp(0, 255).to(torch.uint8)
    v = maxc.to(torch.uint8)
    cases = torch.stack([torch.stack(rgb, 1) for rgb in
                         ((v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q))])  # [6, B, 3, H, W]
    rgb = cases.gather(0, (i.long() % 6).view(1, -1, 1, *i.shape[1:]).expand(1, -1, 3, -1, -1))[0]
    return torch.where((s == 0).unsqueeze(1), v.unsqueeze(1), rgb)


# --------------------------------------------------------------------------------------------------
# CIFAR10-S / CIFAR100-S (pFedFDA, Sec. 5.1, App. C.1.1)
# --------------------------------------------------------------------------------------------------

# The official client_base.py order: client i gets CORRUPTIONS[i % 10].
CORRUPTIONS = ("motion_blur", "defocus_blur", "gaussian_noise", "shot_noise", "impulse_noise",
               "frost", "fog", "jpeg_compression", "brightness", "contrast")
CORRUPTED_CLIENTS = 50  # clients 0..49 are corrupted, 50.. stay clean (the paper's 100-client setup)
CIFAR_S_DEFAULT_MODE = "code"  # the official code's assignment; "unique" follows the paper's wording

# Severity 1..5 parameters of make_cifar_c.py (CIFAR scale), as the official pFedFDA code uses them.
GAUSSIAN_NOISE = (0.04, 0.06, 0.08, 0.09, 0.10)
SHOT_NOISE = (500, 250, 100, 75, 50)
IMPULSE_NOISE = (0.01, 0.02, 0.03, 0.05, 0.07)
DEFOCUS_BLUR = ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1))  # (disk radius, alias blur)
MOTION_BLUR = ((6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5))  # ImageMagick (radius, sigma)
FOG = ((0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75))  # (strength, wibble decay)
FROST = ((1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45))  # (image weight, frost weight)
BRIGHTNESS = (0.05, 0.1, 0.15, 0.2, 0.3)
CONTRAST = (0.75, 0.5, 0.4, 0.3, 0.15)
JPEG_QUALITY = (80, 65, 58, 50, 40)
FROST_FILES = ("frost1.png", "frost2.png", "frost3.png", "frost4.jpg", "frost5.jpg", "frost6.jpg")


def cifar_s_assignment(client: int, num_clients: int, mode: str = CIFAR_S_DEFAULT_MODE, *,
                       num_corrupted: int = CORRUPTED_CLIENTS) -> Optional[tuple[str, int]]:
    """(corruption, severity) of a client, or None for a clean one.

    "code" (default): CORRUPTIONS[i % 10] at severity i % 5 + 1, as the official code does. Since
    i % 5 is a function of i % 10, there are only 10 distinct pairs, each on 5 clients.
    "unique": CORRUPTIONS[i % 10] at severity i // 10 + 1, the 50 distinct pairs of the paper's wording
    (our reading of Sec. 5.1; the paper gives no mapping). Clients >= num_corrupted (50 in the paper) stay
    clean in both modes.
    """
    _check_client(client, num_clients)
    if mode not in ("code", "unique"):
        raise ValueError(f"unknown CIFAR-S assignment mode {mode!r}: expected code or unique")
    if mode == "unique" and num_corrupted > 5 * len(CORRUPTIONS):
        raise ValueError(f"unique mode has only {5 * len(CORRUPTIONS)} pairs; num_corrupted={num_corrupted}")
    if client >= num_corrupted:
        return None
    severity = client % 5 + 1 if mode == "code" else client // len(CORRUPTIONS) + 1
    return CORRUPTIONS[client % len(CORRUPTIONS)], severity


def _to_uint8(x: Tensor) -> Tensor:
    """np.uint8 of clip(., 0, 255): make_cifar_c.py truncates, it does not round."""
    return x.clamp(0, 255).floor().to(torch.uint8)


def _uniform(shape, lo: float, hi: float, gen: torch.Generator) -> Tensor:
    return lo + (hi - lo) * torch.rand(shape, generator=gen, dtype=torch.float64)


def gaussian_noise(x: Tensor, severity: int, gen: torch.Generator) -> Tensor:
    c = GAUSSIAN_NOISE[severity - 1]
    z = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    return _to_uint8((x.double() / 255 + c * z).clamp(0, 1) * 255)


def shot_noise(x: Tensor, severity: int, gen: torch.Generator) -> Tensor:
    c = SHOT_NOISE[severity - 1]
    return _to_uint8((torch.poisson(x.double() / 255 * c, generator=gen) / c).clamp(0, 1) * 255)


def impulse_noise(x: Tensor, severity: int, gen: torch.Generator) -> Tensor:
    """skimage random_noise(mode='s&p', amount=c): each value flips with prob c, to 1 or 0 evenly."""
    c = IMPULSE_NOISE[severity - 1]
    flipped = torch.rand(x.shape, generator=gen, dtype=torch.float64) <= c
    salted = torch.rand(x.shape, generator=gen, dtype=torch.float64) <= 0.5
    out = x.double() / 255
    out = torch.where(flipped & salted, 1.0, torch.where(flipped & ~salted, 0.0, out))
    return _to_uint8(out * 255)


def _defocus_kernel(radius: float, alias_blur: float) -> Tensor:
    """make_cifar_c.disk: an aliased disk on a 17x17 grid, normalised, then cv2.GaussianBlur(3x3).

    Computed like OpenCV (a float64 Gaussian rounded to float32, then a row and a column pass in
    float32): the kernel then matches cv2 bit for bit, which matters because the result is truncated
    to uint8. It is cropped to its non-zero support; zeros change nothing under reflect-101 padding.
    """
    half = 8 if radius <= 8 else int(radius)
    ksize = 3 if radius <= 8 else 5
    grid = torch.arange(-half, half + 1, dtype=torch.float32)
    disk = ((grid.view(-1, 1) ** 2 + grid.view(1, -1) ** 2) <= radius ** 2).float()
    disk = disk / disk.sum()
    t = torch.arange(ksize, dtype=torch.float64) - (ksize - 1) / 2
    g = torch.exp(-t ** 2 / (2 * alias_blur ** 2))
    g = (g / g.sum()).float()
    pad, n = ksize // 2, disk.shape[0]
    rows = nnf.pad(disk[None, None], (pad, pad, 0, 0), mode="reflect")[0, 0]
    rows = sum(rows[:, j:j + n] * g[j] for j in range(ksize))
    cols = nnf.pad(rows[None, None], (0, 0, pad, pad), mode="reflect")[0, 0]
    kernel = sum(cols[j:j + n, :] * g[j] for j in range(ksize))
    nz = kernel.abs().sum(0).nonzero()
    r = int(max(half - nz.min(), nz.max() - half))
    return kernel[half - r:half + r + 1, half - r:half + r + 1]


def defocus_blur(x: Tensor, severity: int, gen: torch.Generator) -> Tensor:
    """cv2.filter2D per channel with the disk kernel (BORDER_REFLECT_101 = torch's "reflect")."""
    kernel = _defocus_kernel(*DEFOCUS_BLUR[severity - 1]).double()
    k = kernel.shape[0]
    img = x.double() / 255
    if k > 1:
        mode = "reflect" if min(x.shape[-2:]) > k // 2 else "replicate"
        img = nnf.pad(img, (k // 2,) * 4, mode=mode)
        img = nnf.conv2d(img, kernel.view(1, 1, k, k).expand(3, 1, k, k), groups=3)
    return _to_uint8(img.clamp(0, 1) * 255)


def motion_blur(x: Tensor, severity: int, gen: torch.Generator) -> Tensor:
    """ImageMagick MotionBlurImage(radius, sigma, angle ~ U(-45, 45)), as Wand calls it.

    A one-sided Gaussian of width 2*ceil(radius)+1 along the angle: output(x, y) = sum_i k_i *
    input(x + round(i cos a), y + round(i sin a)) with edge pixels repeated (ImageMagick's default
    virtual pixels), rounded to 8 bits when written back to PNG.
    """
    radius, sigma = MOTION_BLUR[severity - 1]
    n, c, h, w = x.shape
    width = int(2 * math.ceil(radius) + 1)
    i = torch.arange(width, dtype=torch.float64)
    k = torch.exp(-i ** 2 / (2 * sigma ** 2))
    k = k / k.sum()
    angle = torch.deg2rad(_uniform(n, -45.0, 45.0, gen)).view(-1, 1)
    ox = torch.ceil(i * torch.cos(angle) - 0.5).long()  # [N, width], columns
    oy = torch.ceil(i * torch.sin(angle) - 0.5).long()  # rows
    flat = x.double().reshape(n, c, h * w)
    out = torch.zeros_like(flat)
    rows, cols = torch.arange(h).view(1, -1, 1), torch.arange(w).view(1, 1, -1)
    for j in range(width):
        r = (rows + oy[:, j].view(-1, 1, 1)).clamp(0, h - 1)
        q = (cols + ox[:, j].view(-1, 1, 1)).clamp(0, w - 1)
        idx = (r * w + q).view(n, 1, h * w).expand(n, c, h * w)
        out += k[j] * flat.gather(2, idx)
    return _to_uint8(torch.floor(out + 0.5).view(n, c, h, w))


def _pow2_at_least(n: int) -> int:
    return 1 << max(n - 1, 1).bit_length()


def plasma_fractal(n: int, mapsize: int, wibbledecay: float, gen: torch.Generator) -> Tensor:
    """make_cifar_c.plasma_fractal (diamond-square), batched: [n, mapsize, mapsize] in [0, 1]."""
    if mapsize & (mapsize - 1):
        raise ValueError(f"mapsize must be a power of two, got {mapsize}")
    m = torch.zeros(n, mapsize, mapsize, dtype=torch.float64)
    step, wibble = mapsize, 100.0

    def wibbled(a: Tensor) -> Tensor:
        return a / 4 + wibble * _uniform(a.shape, -wibble, wibble, gen)

    while step >= 2:
        half = step // 2
        corners = m[:, 0::step, 0::step]
        sq = corners + torch.roll(corners, -1, dims=1)
        sq = sq + torch.roll(sq, -1, dims=2)
        m[:, half::step, half::step] = wibbled(sq)
        dr, ul = m[:, half::step, half::step], m[:, 0::step, 0::step]
        m[:, 0::step, half::step] = wibbled(dr + torch.roll(dr, 1, dims=1) + ul + torch.roll(ul, -1, dims=2))
        m[:, half::step, 0::step] = wibbled(dr + torch.roll(dr, 1, dims=2) + ul + torch.roll(ul, -1, dims=1))
        step //= 2
        wibble /= wibbledecay
    m = m - m.amin(dim=(1, 2), keepdim=True)
    return m / m.amax(dim=(1, 2), keepdim=True)


def fog(x: Tensor, severity: int, gen: torch.Generator) -> Tensor:
    """x + c * plasma, rescaled by max / (max + c); a 32x32 map at CIFAR size (a power of two >= H, W)."""
    c, decay = FOG[severity - 1]
    n, _, h, w = x.shape
    size = _pow2_at_least(max(h, w))
    img = x.double() / 255
    max_val = img.amax(dim=(1, 2, 3), keepdim=True)
    img = img + c * plasma_fractal(n, size, decay, gen)[:, None, :h, :w]
    return _to_uint8((img * max_val / (max_val + c)).clamp(0, 1) * 255)


def _rgb2hsv(img: Tensor) -> Tensor:
    """skimage.color.rgb2hsv on [N, 3, H, W] float64, same arithmetic (and tie order: red, green, blue)."""
    r, g, b = img.unbind(1)
    v = img.amax(dim=1)
    delta = v - img.amin(dim=1)
    safe = torch.where(delta == 0, torch.ones_like(delta), delta)
    s = torch.where(delta == 0, torch.zeros_like(v), delta / torch.where(v == 0, torch.ones_like(v), v))
    h = torch.zeros_like(v)
    h = torch.where(r == v, (g - b) / safe, h)
    h = torch.where(g == v, 2.0 + (b - r) / safe, h)
    h = torch.where(b == v, 4.0 + (r - g) / safe, h)
    h = torch.where(delta == 0, torch.zeros_like(h), torch.remainder(h / 6.0, 1.0))
    return torch.stack((h, s, v), 1)


def _hsv2rgb(hsv: Tensor) -> Tensor:
    """skimage.color.hsv2rgb, same arithmetic."""
    h, s, v = hsv.unbind(1)
    hi = torch.floor(h * 6)
    f = h * 6 - hi
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    hi = (hi.long() % 6).unsqueeze(1)
    choices = torch.stack([torch.stack(c, 1) for c in
                           ((v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q))])  # [6, N, 3, H, W]
    return choices.gather(0, hi.expand(-1, 3, -1, -1).unsqueeze(0))[0]


def brightness(x: Tensor, severity: int, gen: torch.Generator) -> Tensor:
    """HSV value + c through skimage's HSV round trip."""
    c = BRIGHTNESS[severity - 1]
    hsv = _rgb2hsv(x.double() / 255)
    hsv = torch.stack((hsv[:, 0], hsv[:, 1], (hsv[:, 2] + c).clamp(0, 1)), 1)
    return _to_uint8(_hsv2rgb(hsv).clamp(0, 1) * 255)


def contrast(x: Tensor, severity: int, gen: torch.Generator) -> Tensor:
    c = CONTRAST[severity - 1]
    img = x.double() / 255
    means = img.mean(dim=(2, 3), keepdim=True)  # per channel, as np.mean(axis=(0, 1)) on HWC
    return _to_uint8(((img - means) * c + means).clamp(0, 1) * 255)


def jpeg_compression(x: Tensor, severity: int, gen: torch.Generator) -> Tensor:
    """PIL JPEG save/load at the given quality, as make_cifar_c.py does (PIL ships with torchvision;
    torchvision.io's codecs are deprecated as of 0.29)."""
    quality = JPEG_QUALITY[severity - 1]
    out = torch.empty_like(x, device="cpu")
    for i, img in enumerate(x.cpu()):
        buf = io.BytesIO()
        Image.fromarray(img.permute(1, 2, 0).numpy()).save(buf, "JPEG", quality=quality)
        out[i] = torch.from_numpy(np.asarray(Image.open(buf).convert("RGB")).copy()).permute(2, 0, 1)
    return out.to(x.device)


def frost_dir_default() -> Optional[Path]:
    """Where the six Hendrycks frost images are looked up: $FL_FROST_DIR, or None."""
    path = os.environ.get("FL_FROST_DIR")
    return Path(path) if path else None


def _resize_like_cv2(img: Tensor, factor: float) -> Tensor:
    """cv2.resize(img, (0, 0), fx=factor, fy=factor) with INTER_LINEAR: the output size is rounded and
    source coordinates use the exact scale 1/factor (not in/out sizes, as torch's interpolate does).
    At factor 0.2 every source coordinate is an integer, so this samples pixels without mixing."""
    out = img.double()
    for dim in (1, 2):
        n_in = out.shape[dim]
        n_out = int(round(n_in * factor))
        src = ((torch.arange(n_out, dtype=torch.float64) + 0.5) / factor - 0.5).clamp(0, n_in - 1)
        lo = src.floor().long()
        hi = (lo + 1).clamp(max=n_in - 1)
        w = (src - lo).view([-1 if d == dim else 1 for d in range(3)])
        out = out.index_select(dim, lo) * (1 - w) + out.index_select(dim, hi) * w
    return out.round().clamp(0, 255)


@functools.lru_cache(maxsize=2)
def _load_frost(frost_dir: Path) -> list[Tensor]:
    """The textures as make_cifar_c.py prepares them: RGB (alpha dropped, as cv2.imread does), resized by 0.2."""
    def read(name: str) -> Tensor:
        with Image.open(frost_dir / name) as img:
            return torch.from_numpy(np.asarray(img.convert("RGB")).copy()).permute(2, 0, 1)
    return [_resize_like_cv2(read(name), 0.2) for name in FROST_FILES]


def _procedural_frost(n: int, h: int, w: int, gen: torch.Generator) -> Tensor:
    """A substitute frost layer (NOT the Hendrycks textures): bright, bluish-white and grainy.

    Built to match the real textures' first-order look at CIFAR scale (after the 0.2 resize, frost1..5
    have channel means of about (146, 167, 180) and a within-crop std of 15-40 grey levels, mostly grain):
    a rough plasma (decay 1.1 keeps the fine scales) plus per-pixel grain, tinted blue."""
    size = _pow2_at_least(max(h, w))
    cloud = plasma_fractal(n, size, 1.1, gen)[:, None, :h, :w] - 0.5
    grain = torch.randn((n, 1, h, w), generator=gen, dtype=torch.float64)
    tint = torch.tensor([0.87, 0.99, 1.07], dtype=torch.float64).view(1, 3, 1, 1)
    return ((168 + 80 * cloud + 18 * grain) * tint).clamp(0, 255)


_warned_frost = False


def frost(x: Tensor, severity: int, gen: torch.Generator, frost_dir: Optional[Path] = None) -> Tensor:
    """c0 * x + c1 * frost crop (one of frost1..5, as np.random.randint(5) never picks frost6).

    Needs the six frost images of Hendrycks' repository (ImageNet-C/create_c/), found in `frost_dir`
    or $FL_FROST_DIR. Without them a procedural frost-like layer stands in (`_procedural_frost`),
    with a warning: that client's shift is then of the right kind but not the paper's.
    """
    global _warned_frost
    c0, c1 = FROST[severity - 1]
    n, _, h, w = x.shape
    frost_dir = frost_dir if frost_dir is not None else frost_dir_default()
    if frost_dir is not None and all((Path(frost_dir) / f).is_file() for f in FROST_FILES):
        textures = _load_frost(Path(frost_dir))
        if min(min(t.shape[1] for t in textures) - h, min(t.shape[2] for t in textures) - w) < 1:
            raise ValueError(f"frost textures (after the 0.2 resize) are too small for {h}x{w} images")
        which = torch.randint(0, 5, (n,), generator=gen)
        layers = []
        for t in which.tolist():
            tex = textures[t]
            top = int(torch.randint(0, tex.shape[1] - h, (1,), generator=gen))
            left = int(torch.randint(0, tex.shape[2] - w, (1,), generator=gen))
            layers.append(tex[:, top:top + h, left:left + w])
        layer = torch.stack(layers).double()
    else:
        if not _warned_frost:
            warnings.warn("frost: Hendrycks' frost images not found (set FL_FROST_DIR); "
                          "using a procedural frost substitute", stacklevel=2)
            _warned_frost = True
        layer = _procedural_frost(n, h, w, gen)
    return _to_uint8(c0 * x.double() + c1 * layer)


CORRUPTION_FNS: dict[str, Callable[..., Tensor]] = {
    "gaussian_noise": gaussian_noise, "shot_noise": shot_noise, "impulse_noise": impulse_noise,
    "defocus_blur": defocus_blur, "motion_blur": motion_blur, "fog": fog, "brightness": brightness,
    "contrast": contrast, "frost": frost, "jpeg_compression": jpeg_compression,
}


def corrupt(x: Tensor, name: str, severity: int, gen: torch.Generator, *, frost_dir: Optional[Path] = None,
            chunk: int = 4096) -> Tensor:
    """One corruption at one severity (1..5) on uint8 images, in chunks to bound float64 memory."""
    _check_images(x)
    if name not in CORRUPTION_FNS or not 1 <= severity <= 5:
        raise ValueError(f"unknown corruption {name!r} / severity {severity}")
    fn = CORRUPTION_FNS[name]
    kwargs = {"frost_dir": frost_dir} if name == "frost" else {}
    device = x.device
    out = [fn(part, severity, gen, **kwargs) for part in x.cpu().split(chunk)]
    return torch.cat(out).to(device) if out else x.clone()


def cifar_s(x: Tensor, client: int, num_clients: int, mode: str = CIFAR_S_DEFAULT_MODE, seed: int = 0, *,
            num_corrupted: int = CORRUPTED_CLIENTS, frost_dir: Optional[Path] = None) -> Tensor:
    """The client's CIFAR-S images: its assigned corruption, or the input itself for a clean client.

    The paper corrupts train and test samples alike. Call this once on the client's train and test
    images together (then split) so both draw from one noise stream; two calls with the same seed
    reuse the same stream for the first images of each.
    """
    _check_images(x)
    pair = cifar_s_assignment(client, num_clients, mode, num_corrupted=num_corrupted)
    if pair is None:
        return x
    gen = torch.Generator().manual_seed(derive_seed(seed, 0, client, "corruption"))
    return corrupt(x, pair[0], pair[1], gen, frost_dir=frost_dir)
