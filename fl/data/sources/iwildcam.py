"""iWildCam 2020 in WILDS' on-disk layout (FedPALS Table 2, after Bai et al. 2024):

    <root>/iwildcam_v2.0/metadata.csv   one row per image: split, location_remapped, y, filename, ...
    <root>/iwildcam_v2.0/train/<filename>

The pool's training split is WILDS' `train` split, each image's domain its camera (location); its test split is
WILDS' out-of-distribution `test` split (other cameras). Labels are WILDS' `y` (182 classes). Images are resized
to `data.image_size` (default 224, the Bai et al. / WILDS convention for ImageNet-pretrained ResNets; the paper
states no preprocessing) and normalised with ImageNet statistics.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from omegaconf import DictConfig

from fl.core import Split
from fl.core.registry import register_dataset
from fl.data.base import DataError, Pool, image_size_param
from fl.data.sources.domains import Entry, cached_images

FOLDER = "iwildcam_v2.0"
NUM_CLASSES = 182
DEFAULT_SIZE = 224
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
COLUMNS = ("split", "location_remapped", "y", "filename")
OBTAIN = ("get it with `pip install wilds` and wilds.get_dataset('iwildcam', download=True, root_dir=<data.root>) "
          "on a machine with a network")


def _rows(base: Path) -> list[dict]:
    metadata = base / "metadata.csv"
    layout = f"metadata.csv with columns {', '.join(COLUMNS)} and train/<filename> images in {base}"
    if not metadata.is_file():
        raise DataError(base if not base.is_dir() else metadata, layout, OBTAIN)
    with metadata.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise DataError(metadata, f"{layout} (missing {', '.join(missing)})", OBTAIN)
        rows = list(reader)
    for row in rows:
        if not (row["y"].isdigit() and row["location_remapped"].isdigit() and int(row["y"]) < NUM_CLASSES):
            raise DataError(metadata, f"{layout} (bad row for {row['filename']!r}: y and location_remapped must be "
                                      f"integers, y < {NUM_CLASSES})", OBTAIN)
    return rows


@dataclass
class Settings:
    """data.* keys of iWildCam (besides data.root)."""
    image_size: Optional[int] = image_size_param(DEFAULT_SIZE)


@register_dataset("iwildcam", Settings)
def load_iwildcam(d: DictConfig) -> Pool:
    base = Path(d.root) / FOLDER
    rows = _rows(base)
    cameras = sorted({int(r["location_remapped"]) for r in rows if r["split"] in ("train", "test")})
    domain = {loc: i for i, loc in enumerate(cameras)}
    splits: dict[str, list[Entry]] = {"train": [], "test": []}
    for r in rows:
        if r["split"] in splits:
            path = base / "train" / r["filename"]
            if not path.is_file():
                raise DataError(path, f"the image metadata.csv lists for {r['filename']!r}", OBTAIN)
            splits[r["split"]].append((path, int(r["y"]), domain[int(r["location_remapped"])]))
    for name, entries in splits.items():
        if not entries:
            raise DataError(base / "metadata.csv", f"rows of the WILDS split {name!r}", OBTAIN)
    x = cached_images(base, int(d.image_size or DEFAULT_SIZE), splits, OBTAIN, d, "iwildcam")
    parts = {name: Split(x[name], torch.tensor([e[1] for e in entries], dtype=torch.int64),
                         torch.tensor([e[2] for e in entries], dtype=torch.int64)) for name, entries in splits.items()}
    return Pool("iwildcam", parts["train"], parts["test"], NUM_CLASSES, [f"species{k}" for k in range(NUM_CLASSES)],
                [f"camera{loc}" for loc in cameras], mean=MEAN, std=STD)
