"""TinyImageNet-200 from the official zip's layout, with the labelled val set as the test split.

Layout under <root>/tiny-imagenet-200/: wnids.txt (the 200 class ids), train/<wnid>/images/*.JPEG and
val/images/*.JPEG labelled by val/val_annotations.txt ("<file>\\t<wnid>\\t<box>"). The unlabelled test/
folder is not used. pFedFDA (official code; App. C.1 counts 120,000 images) pools train and val before
partitioning and FedACD (Sec. 4.1: 100k samples) tests on val: both are a choice of the partition code,
so the pool keeps them apart.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from omegaconf import DictConfig

from fl.core import Split
from fl.core.registry import register_dataset
from fl.data.base import DataError, Pool, image_size_param
from fl.data.sources.domains import Entry, cached_images, list_images

FOLDER = "tiny-imagenet-200"
DEFAULT_SIZE = 64  # native resolution (pFedFDA, App. C.1; FedACD gives no size)
MEAN = STD = (0.5, 0.5, 0.5)  # [-1, 1] as pFedFDA normalises every dataset (Sec. 5.1); FedACD gives none
OBTAIN = "download http://cs231n.stanford.edu/tiny-imagenet-200.zip and unzip it into data.root"


@dataclass
class Settings:
    """data.* keys of TinyImageNet (besides data.root)."""
    image_size: Optional[int] = image_size_param(DEFAULT_SIZE)


def _layout(base: Path) -> str:
    return f"wnids.txt, train/<wnid>/images/*.JPEG, val/images/*.JPEG and val/val_annotations.txt in {base}"


def _entries(base: Path) -> tuple[list[str], list[Entry], list[Entry]]:
    layout = _layout(base)
    wnids_file = base / "wnids.txt"
    if not wnids_file.is_file():
        raise DataError(base if not base.is_dir() else wnids_file, layout, OBTAIN)
    wnids = sorted({w.strip() for w in wnids_file.read_text().splitlines() if w.strip()})
    if not wnids:
        raise DataError(wnids_file, layout, OBTAIN)
    train: list[Entry] = []
    for label, wnid in enumerate(wnids):
        folder = base / "train" / wnid / "images"
        files = list_images(folder) if folder.is_dir() else []
        if not files:
            raise DataError(folder, layout, OBTAIN)
        train += [(f, label, 0) for f in files]
    annotations = base / "val" / "val_annotations.txt"
    if not annotations.is_file():
        raise DataError(annotations, layout, OBTAIN)
    index = {w: i for i, w in enumerate(wnids)}
    test: list[Entry] = []
    for line in annotations.read_text().splitlines():
        fields = line.split()
        if not fields:
            continue
        path = base / "val" / "images" / fields[0]
        if len(fields) < 2 or fields[1] not in index or not path.is_file():
            raise DataError(annotations, f"lines '<file> <wnid> ...' naming files in val/images and wnids in "
                                         f"wnids.txt (bad line: {line.strip()[:60]!r}; {layout})", OBTAIN)
        test.append((path, index[fields[1]], 0))
    if not test:
        raise DataError(annotations, layout, OBTAIN)
    return wnids, train, test


@register_dataset("tinyimagenet", Settings)
def load_tinyimagenet(d: DictConfig) -> Pool:
    base = Path(d.root) / FOLDER
    wnids, train, test = _entries(base)
    x = cached_images(base, int(d.image_size or DEFAULT_SIZE), {"train": train, "test": test}, OBTAIN, d,
                      "tinyimagenet")
    y = {name: torch.tensor([e[1] for e in entries], dtype=torch.int64)
         for name, entries in (("train", train), ("test", test))}
    return Pool("tinyimagenet", Split(x["train"], y["train"]), Split(x["test"], y["test"]), len(wnids), wnids,
                mean=MEAN, std=STD)
