"""Multi-domain image folders (DomainNet-10, Office-Caltech10, PACS) and the image-folder reader they
share with TinyImageNet.

Layout: <root>/<folder>/<domain>/<class>/<image>.{jpg,jpeg,png}. Only the dataset's fixed class list
is read (DomainNet has 345 class folders; FedBN and FedMosaic use 10 of them).

Train/test split, per domain, in this order of preference:
  1. FedBN's split pickles <folder>/<domain>_train.pkl and <domain>_test.pkl, each a pickled
     (paths, text_labels) pair (FedMosaic, Sec. 8, uses FedBN's DomainNet classes; we take FedBN's split too);
  2. list files <folder>/<domain>_train.txt and <domain>_test.txt, one "<path> [label]" per line, as
     DomainNet ships them (labels there index all 345 classes, so the class is read from the path);
  3. otherwise a stratified split of each class folder drawn with a fixed seed (not the run seed: the
     split is part of the dataset, so every run and method sees the same one).
A path in a split file is matched on its last three components (<domain>/<class>/<file>), so FedBN's
"../data/DomainNet/..." prefixes and DomainNet's "clipart/..." ones both resolve under <folder>.

Decoded images are cached once in <folder>/.fl_cache/<size>px/ (fl/data/cache.py), then read into memory or
memory-mapped (data.cache); the cache is keyed by the files (path, size, modification time) and labels, so adding or
editing an image or a split file rebuilds it.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from omegaconf import DictConfig
from torch import Tensor

from fl.config import param
from fl.core import Split
from fl.core.mapped_images import MappedImages
from fl.core.registry import register_dataset
from fl.data import cache
from fl.data.base import DataError, Pool
from fl.data.cache import parts_of

IMAGE_EXTS = (".jpg", ".jpeg", ".png")
CACHE_VERSION = "v2"  # of the decoding (_decode) and the key; a change rebuilds every cache
SPLIT_SEED = 20240601  # fixed on purpose: see the module docstring

Entry = tuple[Path, int, int]  # (image file, label, domain id)


# ----------------------------------------------------------------------------- the shared folder reader

def _decode(path: Path, size: int, obtain: str) -> Tensor:
    """One image as uint8 [3, size, size]. PIL, as FedBN's pipeline: any JPEG/PNG (grey, palette, RGBA,
    CMYK) becomes RGB, then a bilinear (antialiased) resize to size x size, aspect ratio not kept."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            img = img.convert("RGB")
            if img.size != (size, size):
                img = img.resize((size, size), Image.Resampling.BILINEAR)
            return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1)
    except (OSError, ValueError, SyntaxError):  # PIL's errors for truncated or unidentifiable files
        raise DataError(path, "a decodable JPEG or PNG image", obtain) from None


def decode_images(files: list[Path], size: int, obtain: str) -> Tensor:
    """uint8 [N, 3, size, size], in the order of `files` (decoded on a few threads)."""
    out = torch.empty((len(files), 3, size, size), dtype=torch.uint8)

    def work(i: int) -> None:
        out[i] = _decode(files[i], size, obtain)

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        list(pool.map(work, range(len(files))))  # list() re-raises the first DataError
    return out


def cached_images(base: Path, size: int, splits: dict[str, list[Entry]], obtain: str, d: DictConfig,
                  dataset: str) -> dict[str, Tensor | MappedImages]:
    """Decoded images of each split, from the image cache in <base>/.fl_cache/<size>px/ (fl/data/cache.py; in
    memory or memory-mapped, as `data.cache` says) when it was built from these files, else decoded into it first.

    The cache is keyed by the decoder's version, the size and every file's path, size, modification time, label and
    domain, so an edited, added or relabelled image rebuilds it. A decode error writes nothing."""
    h = hashlib.sha1(f"{CACHE_VERSION}|{size}".encode())
    for name, entries in splits.items():
        h.update(f"#{name}\n".encode())
        for path, label, domain in entries:
            st = path.stat()
            h.update(f"{path.relative_to(base).as_posix()}|{label}|{domain}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    files = [e[0] for entries in splits.values() for e in entries]
    counts = {name: len(entries) for name, entries in splits.items()}
    parts = parts_of(counts, 3 * size * size)
    starts = np.cumsum([0, *parts]).tolist()
    return cache.cached_images(d, dataset=dataset, folder=base, tag=f"{size}px", key=h.hexdigest(), counts=counts,
                               shape=(3, size, size), parts=parts,
                               fill=lambda i: decode_images(files[starts[i]:starts[i + 1]], size, obtain))


def list_images(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_EXTS and p.is_file())


# ----------------------------------------------------------------------------- multi-domain datasets

@dataclass(frozen=True)
class DomainDataset:
    name: str
    folder: str
    domains: tuple[str, ...]
    classes: tuple[str, ...]  # folder names, sorted: the label of a class is its index here
    default_size: int
    test_fraction: float  # of each class of each domain, when the domain has no split files
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    obtain: str

    def layout(self, base: Path) -> str:
        return (f"{base}/<domain>/<class>/*.jpg|png with domains {', '.join(self.domains)} and classes "
                f"{', '.join(self.classes)} (optional split files <domain>_train.pkl|txt, <domain>_test.pkl|txt)")


# The 10 DomainNet classes of FedBN, used by FedMosaic (Sec. 8; folder names use underscores).
# 256x256 inputs (Sec. 8) and no normalisation: FedBN's ToTensor-only pipeline (the paper names none).
# At 256 px the 10-class subset is a few GB of uint8; set data.image_size lower for small machines.
# Without split files, 30% of each class is test, close to DomainNet's own train/test ratio.
DOMAINNET = DomainDataset(
    "domainnet", "domainnet", ("clipart", "infograph", "painting", "quickdraw", "real", "sketch"),
    ("bird", "feather", "headphones", "ice_cream", "teapot", "tiger", "whale", "windmill", "wine_glass", "zebra"),
    256, 0.3, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0),
    "download the domain zips from https://ai.bu.edu/M3SDA/ and unzip them there "
    "(FedBN's split pickles from https://github.com/med-air/FedBN go beside them)")

# Office-Caltech10 as FedBN/FedMosaic use it: same 256x256 (Sec. 8), no normalisation (FedBN's pipeline).
OFFICE_CALTECH10 = DomainDataset(
    "office_caltech10", "office_caltech10", ("amazon", "caltech", "dslr", "webcam"),
    ("back_pack", "bike", "calculator", "headphones", "keyboard", "laptop_computer", "monitor", "mouse", "mug",
     "projector"),
    256, 0.2, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0),
    "get FedBN's office_caltech_10_dataset.zip (linked from https://github.com/med-air/FedBN) and unzip it "
    "there, renaming office_caltech_10 to office_caltech10")

# PACS for FedPALS (Sec. 5, App. A.3; an ImageNet-pretrained ResNet-50): 224x224 with ImageNet statistics,
# the Bai et al./WILDS convention (the paper states no preprocessing).
PACS = DomainDataset(
    "pacs", "pacs", ("art_painting", "cartoon", "photo", "sketch"),
    ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person"),
    224, 0.2, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225),
    "download PACS from https://domaingeneralization.github.io/#data and unpack its four domain folders there")


def _split_file_paths(spec: DomainDataset, base: Path, split_file: Path) -> list[str]:
    """Image paths listed by a FedBN pickle or a DomainNet-style list file."""
    layout = f"{split_file.suffix} split file of '<domain>/<class>/<file> [label]' paths ({spec.layout(base)})"
    try:
        if split_file.suffix == ".pkl":  # unpickling runs code: only ever point data.root at data you trust
            with open(split_file, "rb") as f:
                paths = pickle.load(f)[0]
            return [str(p) for p in paths]
        return [line.split()[0] for line in split_file.read_text().splitlines() if line.strip()]
    except Exception:
        raise DataError(split_file, layout, spec.obtain) from None


def _from_split_files(spec: DomainDataset, base: Path, domain: str, dom_id: int,
                      files: dict[str, Path]) -> dict[str, list[Entry]]:
    out: dict[str, list[Entry]] = {}
    for split, split_file in files.items():
        entries = []
        for raw in _split_file_paths(spec, base, split_file):
            parts = Path(raw.replace("\\", "/")).parts[-3:]
            if len(parts) < 3 or parts[1] not in spec.classes:
                continue  # another DomainNet class (the list files cover all 345)
            path = base.joinpath(*parts)
            if parts[0] != domain or not path.is_file():
                raise DataError(path, f"the image listed in {split_file.name} ({spec.layout(base)})", spec.obtain)
            entries.append((path, spec.classes.index(parts[1]), dom_id))
        if not entries:
            raise DataError(split_file, f"a split file listing images of {spec.layout(base)}", spec.obtain)
        out[split] = entries
    return out


def _seeded_split(spec: DomainDataset, base: Path, domain: str, dom_id: int) -> dict[str, list[Entry]]:
    """Stratified per class; each split then shuffled so that a prefix (FedBN truncates training sets)
    mixes the classes. The seed depends only on the dataset and the domain name."""
    rng = np.random.default_rng([SPLIT_SEED, zlib.crc32(f"{spec.name}/{domain}".encode())])
    train: list[Entry] = []
    test: list[Entry] = []
    for label, cls in enumerate(spec.classes):
        folder = base / domain / cls
        files = list_images(folder) if folder.is_dir() else []
        if not files:
            raise DataError(folder, spec.layout(base), spec.obtain)
        perm = rng.permutation(len(files))
        n_test = int(round(spec.test_fraction * len(files)))
        test += [(files[i], label, dom_id) for i in perm[:n_test]]
        train += [(files[i], label, dom_id) for i in perm[n_test:]]
    return {"train": [train[i] for i in rng.permutation(len(train))],
            "test": [test[i] for i in rng.permutation(len(test))]}


def _domain_entries(spec: DomainDataset, base: Path, domain: str, dom_id: int) -> dict[str, list[Entry]]:
    if not (base / domain).is_dir():
        raise DataError(base / domain, spec.layout(base), spec.obtain)
    found = {}
    for split in ("train", "test"):
        for ext in (".pkl", ".txt"):  # FedBN's pickles first: FedBN's own split
            if (base / f"{domain}_{split}{ext}").is_file():
                found[split] = base / f"{domain}_{split}{ext}"
                break
    if len(found) == 1:
        missing = base / f"{domain}_{'test' if 'train' in found else 'train'}.pkl|txt"
        raise DataError(missing, f"train and test split files together ({spec.layout(base)})", spec.obtain)
    if found:
        return _from_split_files(spec, base, domain, dom_id, found)
    return _seeded_split(spec, base, domain, dom_id)


def load_domains(spec: DomainDataset, d: DictConfig) -> Pool:
    size = int(d.image_size or spec.default_size)
    base = Path(d.root) / spec.folder
    if not base.is_dir():
        raise DataError(base, spec.layout(base), spec.obtain)
    splits: dict[str, list[Entry]] = {"train": [], "test": []}
    for dom_id, domain in enumerate(spec.domains):
        for split, entries in _domain_entries(spec, base, domain, dom_id).items():
            splits[split] += entries
    x = cached_images(base, size, splits, spec.obtain, d, spec.name)

    def as_split(name: str) -> Split:
        entries = splits[name]
        return Split(x[name], torch.tensor([e[1] for e in entries], dtype=torch.int64),
                     torch.tensor([e[2] for e in entries], dtype=torch.int64))

    return Pool(spec.name, as_split("train"), as_split("test"), len(spec.classes), list(spec.classes),
                list(spec.domains), spec.mean, spec.std)


@dataclass
class Settings:
    """data.* keys of the multi-domain datasets (besides data.root)."""
    image_size: Optional[int] = param(None, ge=8, help="side of the square images, resized when loaded; null = "
                                      f"{DOMAINNET.default_size} px (DomainNet, Office-Caltech10; FedMosaic Sec. 8), "
                                      f"{PACS.default_size} (PACS)")


@register_dataset("domainnet", Settings)
def load_domainnet(d: DictConfig) -> Pool:
    return load_domains(DOMAINNET, d)


@register_dataset("office_caltech10", Settings)
def load_office_caltech10(d: DictConfig) -> Pool:
    return load_domains(OFFICE_CALTECH10, d)


@register_dataset("pacs", Settings)
def load_pacs(d: DictConfig) -> Pool:
    return load_domains(PACS, d)
