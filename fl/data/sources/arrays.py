"""Bring-your-own data: one .npz or .pt file of arrays, named by data.root.

Keys: x, y (required); domain; x_test, y_test, domain_test; class_names, domain_names; mean, std. x is either uint8
images, [N, H, W], [N, C, H, W] or [N, H, W, C] with C in {1, 3} (stored as NCHW and normalised with mean/std, each
0.5 per channel when not given: fl.data.base.Pool's rule for every dataset, pixels to [-1, 1] as FedMosaic and
pFedFDA do), or floats, used as they are (not normalised): [N, H, W] gets a channel axis ([N, 1, H, W], grayscale)
and [N, H, W, C] with C in {1, 3} is moved to NCHW, as for uint8, so the image models take them; any other shape [N,
...] is a feature vector per sample (for mlp / logistic). Labels are integers in [0, num_classes), with num_classes
= len(class_names), or else the largest label + 1 (then at most twice the number of distinct labels: sparse ids must
be remapped). This is also the route for data no other loader reads, e.g. LEAF's FEMNIST with writer ids saved as
`domain`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from omegaconf import DictConfig
from torch import Tensor

from fl.config import ConfigError, param
from fl.core import Split
from fl.core.registry import register_dataset
from fl.data.base import DataError, Pool

LAYOUT = ("a .npz or .pt file with x and y (optionally domain, x_test, y_test, domain_test, class_names, "
          "domain_names, mean, std)")
OBTAIN = "set data.root to such a file, e.g. written by numpy.savez(path, x=x, y=y)"


def _read(path: Path) -> dict:
    if path.suffix not in (".npz", ".pt") or not path.is_file():
        raise DataError(path, LAYOUT, OBTAIN)
    try:
        if path.suffix == ".npz":
            with np.load(path, allow_pickle=False) as f:
                blob = {k: f[k] for k in f.files}
        else:
            blob = torch.load(path, map_location="cpu", weights_only=True)  # tensors saved from a GPU load anywhere
        if not isinstance(blob, dict):
            raise TypeError
        return blob
    except Exception:
        raise DataError(path, LAYOUT + " (the file is not readable as one)", OBTAIN) from None


def _tensor(v) -> Tensor:
    return v if isinstance(v, Tensor) else torch.from_numpy(np.asarray(v))


def _images_or_features(x: Tensor, path: Path, key: str) -> Tensor:
    if x.is_floating_point():  # float images in the layouts uint8 ones take, so the image models accept them
        x = x.float()
        if x.dim() == 3:
            return x.unsqueeze(1)
        if x.dim() == 4 and x.shape[1] not in (1, 3) and x.shape[-1] in (1, 3):
            return x.permute(0, 3, 1, 2).contiguous()
        return x
    if x.dtype != torch.uint8 or x.dim() not in (3, 4):
        got = str(x.dtype).removeprefix("torch.")
        fix = ("cast pixel values to uint8, features to float32" if x.dtype != torch.uint8 else
               "uint8 images have 3 or 4 dimensions; save features as floats")
        raise DataError(path, f"{key} as uint8 images [N,H,W]/[N,C,H,W]/[N,H,W,C] or float features, but {key} is "
                              f"{got} of shape {tuple(x.shape)}: {fix} ({LAYOUT})", OBTAIN)
    if x.dim() == 3:
        return x.unsqueeze(1)
    if x.shape[1] in (1, 3):
        return x
    if x.shape[-1] in (1, 3):
        return x.permute(0, 3, 1, 2).contiguous()
    raise DataError(path, f"{key} with 1 or 3 channels first or last (got {tuple(x.shape)}; {LAYOUT})", OBTAIN)


def _split(blob: dict, path: Path, suffix: str, size: Optional[int]) -> Optional[Split]:
    xk, yk, dk = f"x{suffix}", f"y{suffix}", f"domain{suffix}"
    if xk not in blob and yk not in blob:
        return None
    if xk not in blob or yk not in blob:
        raise DataError(path, f"{xk} and {yk} together ({LAYOUT})", OBTAIN)
    x = _images_or_features(_tensor(blob[xk]), path, xk)
    y = _tensor(blob[yk])
    domain = _tensor(blob[dk]) if dk in blob else None
    for key, v in ((yk, y), (dk, domain)):
        if v is not None and (v.is_floating_point() or v.dim() != 1 or len(v) != len(x) or (len(v) and v.min() < 0)):
            raise DataError(path, f"{key} as {len(x)} non-negative integers, one per row of {xk} ({LAYOUT})", OBTAIN)
    if size and x.dtype == torch.uint8 and x.shape[-2:] != (size, size):
        from torchvision.transforms.v2.functional import resize
        x = resize(x, [size, size], antialias=True)
    return Split(x, y.long(), None if domain is None else domain.long())


def _names(blob: dict, key: str) -> list[str]:
    v = blob.get(key)
    return [] if v is None else [str(s) for s in (v.tolist() if hasattr(v, "tolist") else v)]


@dataclass
class Settings:
    """data.* keys of the arrays file (data.root names it)."""
    image_size: Optional[int] = param(None, ge=8, help="resize uint8 images to this side when loaded; null = as "
                                      "stored (float inputs are never resized)")


@register_dataset("arrays", Settings)
def load_arrays(d: DictConfig) -> Pool:
    path = Path(d.root)
    blob = _read(path)
    train = _split(blob, path, "", d.image_size)
    if train is None or len(train) == 0:
        raise DataError(path, LAYOUT, OBTAIN)
    test = _split(blob, path, "_test", d.image_size)
    if test is not None and (train.domain is None) != (test.domain is None):
        raise DataError(path, f"domain and domain_test together or neither ({LAYOUT})", OBTAIN)
    if test is not None and (train.x.shape[1:] != test.x.shape[1:] or train.x.dtype != test.x.dtype):
        raise DataError(path, f"x and x_test of the same sample shape and dtype ({LAYOUT})", OBTAIN)
    splits = [s for s in (train, test) if s is not None and len(s)]
    class_names = _names(blob, "class_names")
    num_classes = len(class_names) or int(max(s.y.max() for s in splits)) + 1
    if any(s.y.max() >= num_classes for s in splits):
        raise DataError(path, f"labels below len(class_names) = {num_classes} ({LAYOUT})", OBTAIN)
    used = len(torch.cat([s.y for s in splits]).unique())
    if not class_names and num_classes > 2 * used:  # sparse ids (say {0, 10**9}): every id below the largest is a class
        ys = "y and y_test hold" if test else "y holds"
        raise ConfigError(f"{path}: labels must be integers in [0, num_classes); {ys} {used} distinct labels up to "
                          f"{num_classes - 1}: remap them to 0..{used - 1} (numpy.unique(y, return_inverse=True)), "
                          "or give class_names to keep these ids")
    domain_names = _names(blob, "domain_names")
    if train.domain is not None:
        num_domains = int(max(s.domain.max() for s in splits)) + 1
        domain_names = domain_names or [f"domain{i}" for i in range(num_domains)]
        if num_domains > len(domain_names):
            raise DataError(path, f"domain ids below len(domain_names) = {len(domain_names)} ({LAYOUT})", OBTAIN)
    mean = std = None  # uint8 images without them: Pool's default, 0.5 per channel
    if train.x.dtype == torch.uint8 and ("mean" in blob or "std" in blob):
        channels = train.x.shape[1]
        mean, std = (tuple(float(v) for v in _tensor(blob[k]).reshape(-1)) if k in blob else (0.5,) * channels
                     for k in ("mean", "std"))
        if len(mean) != channels or len(std) != channels:
            raise DataError(path, f"mean and std with {channels} values ({LAYOUT})", OBTAIN)
    return Pool("arrays", train, test, num_classes, class_names, domain_names, mean, std)
