"""What a loader returns (a Pool, before it is split over the clients), the settings loaders share and how a missing
dataset is reported."""
from __future__ import annotations

import contextlib
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor

from fl.config import ConfigError, param
from fl.core import Split
from fl.core.mapped_images import MappedImages
from fl.core.plugins import type_name


class DataError(ConfigError):
    """A missing or malformed dataset: one line naming the path (said to be missing, or there but malformed), the
    layout expected and how to get it."""

    def __init__(self, path, expected: str, obtain: str):
        what = f"dataset at {path} is malformed" if Path(path).exists() else f"dataset not found at {path}"
        super().__init__(f"{what}: expected {expected}; {obtain}")


# The statistics of uint8 images whose dataset gives none: every channel to [-1, 1], as the loaders of CIFAR, (F)MNIST,
# TinyImageNet and `arrays` files do (FedMosaic's and pFedFDA's Normalize(0.5, 0.5)). A fixed value rather than one
# computed from the pool: it needs no pass over the images (a memory-mapped pool may be larger than memory) and does
# not change with the pool's size or split. A dataset with its own statistics sets them (pixel_stats computes them).
DEFAULT_MEAN = DEFAULT_STD = 0.5


@dataclass
class Pool:
    """A labelled dataset as a loader returns it, before it is split over clients.

    train/test: the dataset's own splits (test is None when the dataset has no official test split);
    domain ids, when present, index `domain_names`.

    Inputs: `x` is either uint8 images [N, C, H, W] (channels first; a channels-last [N, H, W, C] array becomes
    one with x.permute(0, 3, 1, 2).contiguous()), or floats of any shape, used as they are (features, or images
    already scaled; never normalised). Each batch of uint8 images becomes (x / 255 - mean) / std, channel by channel:
    mean/std are per-channel statistics of the [0, 1] pixel values; left None they are 0.5 for every channel
    (DEFAULT_MEAN, DEFAULT_STD: pixels to [-1, 1]), the same for every dataset; (0, ..., 0) and (1, ..., 1) keep the
    [0, 1] values (FedBN's ToTensor-only pipeline). Float inputs take no mean/std. `check_pool` refuses anything else
    when the data is loaded, before a run directory exists.
    """
    name: str
    train: Split
    test: Optional[Split]
    num_classes: int
    class_names: list[str] = field(default_factory=list)
    domain_names: list[str] = field(default_factory=list)
    mean: Optional[tuple[float, ...]] = None
    std: Optional[tuple[float, ...]] = None
    fine_labels: Optional[tuple[Tensor, Optional[Tensor]]] = None  # (train, test) finer labels, e.g. CIFAR-100's

    def __post_init__(self):
        x = getattr(self.train, "x", None)  # check_contract names a malformed pool when it is loaded
        if (self.mean is None and self.std is None and isinstance(x, (Tensor, MappedImages))
                and x.dtype == torch.uint8 and x.dim() == 4):
            self.mean, self.std = (DEFAULT_MEAN,) * x.shape[1], (DEFAULT_STD,) * x.shape[1]


def pixel_stats(x: Tensor, rows: int = 4096) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and (unbiased) std of uint8 images [N, C, H, W], as values in [0, 1]. The sums are exact
    integers and each figure one correctly rounded division, so the statistics are the same bits on every machine
    (a float reduction's order, hence its last bits, depends on the CPU's kernels)."""
    n, c = x.shape[0] * x.shape[2] * x.shape[3], x.shape[1]
    total, squares = [0] * c, [0] * c
    for part in x.split(rows):
        wide = part.to(torch.int64)
        total = [t + int(s) for t, s in zip(total, wide.sum(dim=(0, 2, 3)))]
        squares = [q + int(s) for q, s in zip(squares, wide.square().sum(dim=(0, 2, 3)))]
    mean = tuple(t / (255 * n) for t in total)
    std = tuple(((n * q - t * t) / (n * (n - 1))) ** 0.5 / 255 for t, q in zip(total, squares))
    return mean, std


@contextlib.contextmanager
def removed_if_failed(folder: Path):
    """A download into `folder`: the folders it creates on the way (torchvision makes them before it fetches
    anything) are removed again if it fails, so a failed download leaves no empty dataset folder behind."""
    new = None
    for path in (folder, *folder.parents):
        if path.exists():
            break
        new = path  # the outermost folder that does not exist yet
    try:
        yield
    except BaseException:
        if new is not None:
            shutil.rmtree(new, ignore_errors=True)
        raise


def image_size_param(native: int, what: str = "images") -> Any:
    """A dataset's `data.image_size` setting: the side its square images are resized to (null: `native`)."""
    return param(None, ge=8, help=f"side of the square {what}, resized when loaded; null = {native} px")


def download_param() -> Any:
    """The `data.download` setting of a dataset torchvision can fetch."""
    return param(False, help="let torchvision download the dataset when its files are missing (needs a network)")


def check_layout(pool: Pool, where: str) -> None:
    """The inputs' dtype and layout, and their mean/std, as Pool's docstring states them; one line naming `where`
    and the fix otherwise (a channels-last pool would pass every other check and fail at the model)."""
    splits = [(k, s) for k, s in (("x", pool.train), ("x_test", pool.test)) if s is not None]
    for key, split in splits:
        x, shape = split.x, tuple(split.x.shape)
        if x.dtype != torch.uint8 and not x.is_floating_point():
            raise ConfigError(f"{where}: {key} is {str(x.dtype).removeprefix('torch.')}; inputs are uint8 images "
                              "[N, C, H, W] (normalised with the pool's mean/std) or floats (used as they are): "
                              "cast pixel values to uint8, features to float32")
        if x.dtype == torch.uint8 and x.dim() != 4:
            fix = "x.unsqueeze(1) for grayscale [N, H, W]" if x.dim() == 3 else "store features as float32"
            raise ConfigError(f"{where}: {key} holds uint8 of shape {shape}; uint8 inputs are images [N, C, H, W]: "
                              f"{fix}")
        if x.dim() == 4 and shape[-1] in (1, 3) and shape[1] not in (1, 3):
            raise ConfigError(f"{where}: {key} of shape {shape} is channels-last [N, H, W, C]; images are channels-"
                              f"first [N, C, H, W]: x.permute(0, 3, 1, 2).contiguous() gives "
                              f"{(shape[0], shape[3], shape[1], shape[2])}")
    if pool.test is not None and (pool.test.x.shape[1:] != pool.train.x.shape[1:]
                                  or pool.test.x.dtype != pool.train.x.dtype):
        raise ConfigError(f"{where}: x_test is {pool.test.x.dtype} {tuple(pool.test.x.shape[1:])} per sample, x "
                          f"{pool.train.x.dtype} {tuple(pool.train.x.shape[1:])}; both splits need the same")
    if pool.train.x.is_floating_point():
        if pool.mean is not None or pool.std is not None:
            raise ConfigError(f"{where}: mean/std are set for float inputs, which are used as they are; mean/std "
                              "normalise uint8 images only: leave them None (or store uint8 images)")
        return
    channels = pool.train.x.shape[1]
    if pool.mean is None or pool.std is None or len(pool.mean) != channels or len(pool.std) != channels:
        raise ConfigError(f"{where}: mean={pool.mean} std={pool.std} for {channels}-channel images; give both with "
                          f"{channels} values each, or neither (0.5 each)")


def check_contract(pool, where: str) -> None:
    """What a dataset plug-in returns, as Pool's fields declare it: types, lengths, label dtype and rank, finite
    mean/std, one class name per class, one domain id per sample within its names; one line naming `where` (the
    dataset and, for an outside plug-in, its file) otherwise, before the data is split or drawn."""
    if not isinstance(pool, Pool):
        raise ConfigError(f"{where}: returned {type_name(pool)}, not a fl.data.Pool")
    if not isinstance(pool.num_classes, int) or isinstance(pool.num_classes, bool) or pool.num_classes < 1:
        raise ConfigError(f"{where}: num_classes={pool.num_classes!r}; it must be a positive int")
    for name, split in (("train", pool.train), ("test", pool.test)):
        if split is None and name == "test":
            continue
        if not isinstance(split, Split):
            raise ConfigError(f"{where}: {name} is {type_name(split)}, not a fl.data.Split(x, y[, domain])")
        xk, yk, dk = ("x", "y", "domain") if name == "train" else ("x_test", "y_test", "domain_test")
        if not isinstance(split.x, (Tensor, MappedImages)):
            raise ConfigError(f"{where}: {xk} is {type_name(split.x)}, not a torch.Tensor (torch.from_numpy "
                              "converts an array)")
        if not isinstance(split.y, Tensor):
            raise ConfigError(f"{where}: {yk} is {type_name(split.y)}, not a torch.Tensor (torch.from_numpy "
                              "converts an array)")
        if split.y.dim() != 1 or split.y.dtype.is_floating_point or split.y.dtype in (torch.bool, torch.complex64):
            raise ConfigError(f"{where}: {yk} is {str(split.y.dtype).removeprefix('torch.')} of shape "
                              f"{tuple(split.y.shape)}; labels are one integer class id per sample, int64 of shape "
                              "[N] (y.long(), or y.argmax(1) for one-hot rows)")
        if split.x.shape[0] != split.y.shape[0]:
            raise ConfigError(f"{where}: {xk} has {split.x.shape[0]} samples and {yk} {split.y.shape[0]}; every "
                              "sample needs one label")
        if split.domain is not None:
            if not isinstance(split.domain, Tensor) or split.domain.dim() != 1 or split.domain.dtype.is_floating_point:
                raise ConfigError(f"{where}: {dk} is {type_name(split.domain)}; domain ids are an integer "
                                  "torch.Tensor of shape [N]")
            if split.domain.shape[0] != split.y.shape[0]:
                raise ConfigError(f"{where}: {dk} has {split.domain.shape[0]} entries for {split.y.shape[0]} "
                                  "samples; one domain id per sample")
            if len(split.domain) and (int(split.domain.min()) < 0 or
                                      (pool.domain_names and int(split.domain.max()) >= len(pool.domain_names))):
                raise ConfigError(f"{where}: {dk} holds ids outside [0, {len(pool.domain_names)}), the domain_names "
                                  f"{list(pool.domain_names)}")
    if pool.class_names and len(pool.class_names) != pool.num_classes:
        raise ConfigError(f"{where}: {len(pool.class_names)} class_names for num_classes={pool.num_classes}; give one "
                          "name per class, or none")
    for key, values in (("mean", pool.mean), ("std", pool.std)):
        if values is not None and not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
            raise ConfigError(f"{where}: {key}={list(values)}; each channel's must be a finite number")


def check_pool(pool: Pool, where: str) -> None:
    """Refuse data faults when the data is loaded, in one line naming `where` (the file or data.name): left in,
    they surface later as some method's failure (a NaN pixel trains silently, inf gives a non-finite loss,
    one class crashes the metrics, a label id of 10**9 sizes an evaluator's buffer by it)."""
    check_contract(pool, where)
    check_layout(pool, where)
    K = pool.num_classes
    for xk, yk, split in (("x", "y", pool.train), ("x_test", "y_test", pool.test)):
        if split is None or not len(split):
            continue
        if split.x.is_floating_point():
            bad = torch.nonzero(~torch.isfinite(split.x).reshape(len(split), -1).all(1)).flatten()
            if len(bad):
                raise ConfigError(f"{where}: {xk} holds NaN or inf in {len(bad)} of {len(split)} samples (first: "
                                  f"sample {int(bad[0])}); inputs must be finite: drop or impute those samples")
        lo, hi = int(split.y.min()), int(split.y.max())
        if lo < 0 or hi >= K:
            raise ConfigError(f"{where}: {yk} holds label {lo if lo < 0 else hi}; labels must be integers in "
                              f"[0, num_classes) = [0, {K}): remap them")
    x = pool.train.x
    lo, hi = x.extrema() if isinstance(x, MappedImages) else (x.min(), x.max())  # a map's range: recorded when built
    if lo == hi:  # a constant input: nothing to learn, and a std computed from it is 0
        raise ConfigError(f"{where}: every value of x is {float(lo):g} (zero std); the inputs must vary")
    if pool.std is not None and not all(s > 0 and s != float("inf") for s in pool.std):
        raise ConfigError(f"{where}: std={list(pool.std)} divides the inputs in normalisation; each channel's "
                          "must be finite and > 0")
    classes = pool.train.y.unique()
    if len(classes) < 2:
        raise ConfigError(f"{where}: y holds one class ({int(classes[0])}) only; a classifier needs at least 2 "
                          "classes")


@dataclass
class Candidates:
    """What a partition splits over the clients: the samples left after the held-out sets, by position. `labels`
    are the labels it splits on (data.partition.labels), `domains` each sample's domain id (None: the dataset has
    no domains); `dataset` (data.name) is for messages."""
    labels: np.ndarray
    domains: Optional[np.ndarray]
    dataset: str

    def __len__(self) -> int:
        return len(self.labels)

    def need_domains(self, partition: str) -> np.ndarray:
        if self.domains is None:
            raise ConfigError(f"data.partition.name={partition} needs a dataset with domains; data.name="
                              f"{self.dataset!r} has none")
        return self.domains


def check_enough(n: int, num_clients: int, per_client: int, key: str) -> None:
    """A partition giving each client `per_client` samples needs that many per client."""
    if per_client * num_clients > n:
        raise ConfigError(f"{key}={per_client} x data.num_clients={num_clients} exceeds the {n} samples available")
