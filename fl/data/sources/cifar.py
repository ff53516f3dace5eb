"""CIFAR-10, CIFAR-100 and CIFAR-20 from torchvision's on-disk layout.

The pickles are read here rather than through torchvision's dataset classes: those re-hash every file
against the official md5 sums on each load, which refuses any re-packed copy (and the tiny test copies)
and costs a second per load. Downloading still goes through torchvision (data.download=true), which
checks the archive's md5 once.

CIFAR-20 is CIFAR-100 with the 20 coarse superclass labels as y (FedDRM, Sec. 3.1). The pickle's
coarse_labels are the standard CIFAR100_FINE_TO_COARSE mapping of the fine labels. FedDRM partitions
CIFAR-20 on the *fine* labels (official code; the paper does not say): the partition code gets them from
`cifar100_fine_labels(d)`, aligned sample for sample with the pool's train and test splits.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from omegaconf import DictConfig
from torch import Tensor

from fl.core import Split
from fl.core.registry import register_dataset
from fl.data.base import DataError, Pool, download_param, image_size_param, removed_if_failed

# Normalize(0.5, 0.5) -> [-1, 1]: FedDRM (official code), FedMosaic (Sec. 8), pFedFDA (Sec. 5.1);
# FedACD gives no preprocessing.
MEAN = STD = (0.5, 0.5, 0.5)
NATIVE_SIZE = 32
OBTAIN = "set data.download=true to fetch it with torchvision"
REFETCH = "delete the folder and set data.download=true to fetch it again with torchvision"


@dataclass
class Settings:
    """data.* keys of the CIFAR datasets (besides data.root)."""
    download: bool = download_param()
    image_size: Optional[int] = image_size_param(NATIVE_SIZE)


CIFAR10 = ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], "batches.meta")
CIFAR100 = ("cifar-100-python", ["train"], ["test"], "meta")


def _ensure(d: DictConfig, layout: tuple, tv_name: str) -> Path:
    """The dataset folder; downloads it through torchvision first when files are missing and allowed."""
    folder, train, test, meta = layout
    base = Path(d.root) / folder
    files = [base / f for f in train + test + [meta]]
    if not all(f.is_file() for f in files) and d.download:
        import torchvision.datasets as tvd
        try:
            with removed_if_failed(base):
                getattr(tvd, tv_name)(d.root, train=True, download=True)
        except Exception as err:  # no network, bad archive
            raise DataError(base, f"torchvision's {folder}/ ({', '.join(train + test + [meta])})",
                            f"the download failed ({str(err).splitlines()[0] if str(err) else type(err).__name__}); "
                            "check the network or put the files there by hand") from None
    for f in files:
        if not f.is_file():
            raise DataError(f if base.is_dir() else base,
                            f"torchvision's {folder}/ with {', '.join(train + test + [meta])}", OBTAIN)
    return base


def _unpickle(path: Path, keys: tuple[str, ...]) -> dict:
    try:
        with open(path, "rb") as f:
            entry = pickle.load(f, encoding="latin1")
        if not isinstance(entry, dict) or any(k not in entry for k in keys):
            raise KeyError
        return entry
    except Exception:
        raise DataError(path, f"a CIFAR pickle (a dict with keys {', '.join(keys)})", REFETCH) from None


def _read(base: Path, names: list[str], label_keys: tuple[str, ...]) -> tuple[Tensor, list[Tensor]]:
    """uint8 images [N, 3, 32, 32] and one int64 label vector per key, over the listed batch files."""
    xs, ys = [], [[] for _ in label_keys]
    for name in names:
        entry = _unpickle(base / name, ("data",) + label_keys)
        try:
            x = np.asarray(entry["data"], dtype=np.uint8).reshape(-1, 3, NATIVE_SIZE, NATIVE_SIZE)
            labels = [np.asarray(entry[k], dtype=np.int64).reshape(-1) for k in label_keys]
            if any(len(lab) != len(x) for lab in labels):
                raise ValueError
        except (ValueError, TypeError):
            raise DataError(base / name, "'data' of N x 3072 uint8 and N labels per key", REFETCH) from None
        xs.append(torch.from_numpy(x.copy()))
        for out, lab in zip(ys, labels):
            out.append(torch.from_numpy(lab))
    return torch.cat(xs), [torch.cat(y) for y in ys]


def _resize(x: Tensor, d: DictConfig) -> Tensor:
    size = int(d.image_size or NATIVE_SIZE)
    if size == NATIVE_SIZE:
        return x
    from torchvision.transforms.v2.functional import resize
    return resize(x, [size, size], antialias=True)


def _load(d: DictConfig, name: str, layout: tuple, tv_name: str, label_key: str, names_key: str) -> Pool:
    base = _ensure(d, layout, tv_name)
    _, train_files, test_files, meta_file = layout
    class_names = [str(c) for c in _unpickle(base / meta_file, (names_key,))[names_key]]
    x_tr, (y_tr,) = _read(base, train_files, (label_key,))
    x_te, (y_te,) = _read(base, test_files, (label_key,))
    for y, files in ((y_tr, train_files), (y_te, test_files)):
        if len(y) and (y.min() < 0 or y.max() >= len(class_names)):
            raise DataError(base / files[0], f"{label_key} in [0, {len(class_names)})", REFETCH)
    return Pool(name, Split(_resize(x_tr, d), y_tr), Split(_resize(x_te, d), y_te), len(class_names), class_names,
                mean=MEAN, std=STD)


@register_dataset("cifar10", Settings)
def load_cifar10(d: DictConfig) -> Pool:
    return _load(d, "cifar10", CIFAR10, "CIFAR10", "labels", "label_names")


@register_dataset("cifar100", Settings)
def load_cifar100(d: DictConfig) -> Pool:
    return _load(d, "cifar100", CIFAR100, "CIFAR100", "fine_labels", "fine_label_names")


@register_dataset("cifar20", Settings)
def load_cifar20(d: DictConfig) -> Pool:
    """CIFAR-100 images, y = the 20 coarse labels; `Pool.fine_labels` holds the 100 fine labels, on which
    FedDRM partitions (`data.partition.labels=fine`)."""
    pool = _load(d, "cifar20", CIFAR100, "CIFAR100", "coarse_labels", "coarse_label_names")
    pool.fine_labels = cifar100_fine_labels(d)
    return pool


def cifar100_fine_labels(d: DictConfig) -> tuple[Tensor, Tensor]:
    """(train_fine, test_fine) int64 labels in [0, 100), in the same sample order as `load_cifar20(d)`."""
    base = _ensure(d, CIFAR100, "CIFAR100")
    _, train_files, test_files, _ = CIFAR100
    return _read(base, train_files, ("fine_labels",))[1][0], _read(base, test_files, ("fine_labels",))[1][0]
