"""What a loader returns (a Pool, before it is split over the clients), the settings loaders share and how a missing
dataset is reported."""
from __future__ import annotations

import contextlib
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


class DataError(ConfigError):
    """A missing or malformed dataset: one line naming the path (said to be missing, or there but malformed), the
    layout expected and how to get it."""

    def __init__(self, path, expected: str, obtain: str):
        what = f"dataset at {path} is malformed" if Path(path).exists() else f"dataset not found at {path}"
        super().__init__(f"{what}: expected {expected}; {obtain}")


@dataclass
class Pool:
    """A labelled dataset as a loader returns it, before it is split over clients.

    train/test: the dataset's own splits (test is None when the dataset has no official test split);
    domain ids, when present, index `domain_names`. mean/std: per-channel statistics of the [0, 1]
    pixel values used to normalise uint8 images (None for float inputs, which are used as they are).
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


def check_pool(pool: Pool, where: str) -> None:
    """Refuse data faults when the data is loaded, in one line naming `where` (the file or data.name): left in,
    they surface later as some method's failure (a NaN pixel trains silently, inf gives a non-finite loss,
    one class crashes the metrics, a label id of 10**9 sizes an evaluator's buffer by it)."""
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
