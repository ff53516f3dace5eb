"""Tiny fabricated copies of every real dataset's on-disk layout, written on the fly.

Each function writes under `root` exactly the files the real download has (same names, same formats:
CIFAR pickles, idx files, JPEG/PNG folders), with a handful of random images per class, and returns
what a test needs to check the loader against. Images are random noise; labels follow a fixed pattern.
"""
from __future__ import annotations

import pickle
import struct
from pathlib import Path

import numpy as np
import torch
from PIL import Image

CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _pickle(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(obj, f)


def cifar10(root: Path, per_batch: int = 4, n_test: int = 6) -> dict:
    """cifar-10-batches-py/: data_batch_1..5, test_batch, batches.meta (torchvision's layout)."""
    base, rng = Path(root) / "cifar-10-batches-py", _rng(10)
    ys = {}
    for i, name in enumerate([f"data_batch_{b}" for b in range(1, 6)] + ["test_batch"]):
        n = n_test if name == "test_batch" else per_batch
        labels = [(i * per_batch + j) % 10 for j in range(n)]
        _pickle(base / name, {"batch_label": name, "labels": labels,
                              "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), "filenames": [""] * n})
        ys[name] = labels
    _pickle(base / "batches.meta", {"label_names": CIFAR10_NAMES, "num_cases_per_batch": per_batch})
    return {"train_labels": sum((ys[f"data_batch_{b}"] for b in range(1, 6)), []), "test_labels": ys["test_batch"]}


def cifar100(root: Path, n_train: int = 24, n_test: int = 8) -> dict:
    """cifar-100-python/: train, test, meta, with fine labels whose coarse label is fine // 5."""
    base, rng = Path(root) / "cifar-100-python", _rng(100)
    out = {}
    for name, n in (("train", n_train), ("test", n_test)):
        fine = [(7 * j + (name == "test")) % 100 for j in range(n)]
        _pickle(base / name, {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), "fine_labels": fine,
                              "coarse_labels": [f // 5 for f in fine], "filenames": [""] * n})
        out[f"{name}_fine"] = fine
    _pickle(base / "meta", {"fine_label_names": [f"fine{i:02d}" for i in range(100)],
                            "coarse_label_names": [f"coarse{i:02d}" for i in range(20)]})
    return out


def _idx(path: Path, arr: np.ndarray) -> None:
    """An idx file (big-endian header: 0, 0, dtype 0x08 = uint8, ndim; then each dimension)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = struct.pack(">BBBB", 0, 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    path.write_bytes(header + np.ascontiguousarray(arr, dtype=np.uint8).tobytes())


def _idx_pair(raw: Path, prefix: str, n: int, num_classes: int, label_offset: int, rng) -> np.ndarray:
    labels = (np.arange(n) % num_classes + label_offset).astype(np.uint8)
    images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
    _idx(raw / f"{prefix}-images-idx3-ubyte", images)
    _idx(raw / f"{prefix}-labels-idx1-ubyte", labels)
    return images


def fmnist(root: Path, n_train: int = 20, n_test: int = 10) -> dict:
    raw, rng = Path(root) / "FashionMNIST" / "raw", _rng(28)
    return {"train_images": _idx_pair(raw, "train", n_train, 10, 0, rng),
            "test_images": _idx_pair(raw, "t10k", n_test, 10, 0, rng)}


EMNIST_CLASSES = {"byclass": 62, "bymerge": 47, "balanced": 47, "letters": 26, "digits": 10, "mnist": 10}


def emnist(root: Path, split: str = "byclass", n_train: int = 70, n_test: int = 20) -> dict:
    """EMNIST/raw/emnist-<split>-{train,test}-*-ubyte; "letters" labels run 1..26 as in the real files."""
    raw, rng = Path(root) / "EMNIST" / "raw", _rng(62)
    k, offset = EMNIST_CLASSES[split], int(split == "letters")
    return {"train_images": _idx_pair(raw, f"emnist-{split}-train", n_train, k, offset, rng),
            "test_images": _idx_pair(raw, f"emnist-{split}-test", n_test, k, offset, rng)}


def _image(path: Path, h: int, w: int, channels: int, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = _rng(seed).integers(0, 256, (h, w, channels), dtype=np.uint8)
    Image.fromarray(pixels[..., 0] if channels == 1 else pixels).save(path, format="PNG" if path.suffix == ".png"
                                                                      else "JPEG")


def tinyimagenet(root: Path, wnids=("n02", "n01", "n03"), per_class: int = 3, n_val: int = 5) -> dict:
    """tiny-imagenet-200/: wnids.txt (unsorted, as the real one), train/<wnid>/images, val/ + annotations.
    One training image is greyscale, to check the conversion to 3 channels."""
    base = Path(root) / "tiny-imagenet-200"
    base.mkdir(parents=True, exist_ok=True)
    (base / "wnids.txt").write_text("\n".join(wnids) + "\n")
    for c, wnid in enumerate(wnids):
        (base / "train" / wnid / f"{wnid}_boxes.txt").parent.mkdir(parents=True, exist_ok=True)
        (base / "train" / wnid / f"{wnid}_boxes.txt").write_text("")
        for i in range(per_class):
            _image(base / "train" / wnid / "images" / f"{wnid}_{i}.JPEG", 64, 64, 1 if (c, i) == (0, 0) else 3,
                   seed=100 * c + i)
    lines, val_wnids = [], []
    for i in range(n_val):
        wnid = wnids[i % len(wnids)]
        _image(base / "val" / "images" / f"val_{i}.JPEG", 64, 64, 3, seed=1000 + i)
        lines.append(f"val_{i}.JPEG\t{wnid}\t0\t0\t63\t63")
        val_wnids.append(wnid)
    (base / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    return {"val_wnids": val_wnids}


def domain_folders(root: Path, folder: str, domains, classes, per_class: int = 3, png_domains=(),
                   extra_classes=()) -> Path:
    """<root>/<folder>/<domain>/<class>/*.jpg (*.png in `png_domains`, as PACS's sketches), of varying
    sizes, the first of each class greyscale. `extra_classes`: folders the loader must ignore (DomainNet
    has 345 classes)."""
    base = Path(root) / folder
    for d, domain in enumerate(domains):
        ext = ".png" if domain in png_domains else ".jpg"
        for c, cls in enumerate(list(classes) + list(extra_classes)):
            for i in range(per_class):
                _image(base / domain / cls / f"{domain}_{cls}_{i}{ext}", 20 + 3 * i, 24 + 2 * c, 3 if i else 1,
                       seed=10000 * d + 100 * c + i)
    return base


def split_files(base: Path, domain: str, train: list[str], test: list[str], kind: str = "txt") -> None:
    """<domain>_train/_test split files: DomainNet's "path label" lines or FedBN's (paths, labels) pickles."""
    for split, paths in (("train", train), ("test", test)):
        if kind == "txt":
            (base / f"{domain}_{split}.txt").write_text("".join(f"{p} 0\n" for p in paths))
        else:
            labels = np.array([Path(p).parts[-2] for p in paths])
            _pickle(base / f"{domain}_{split}.pkl", (np.array([f"../data/DomainNet/{p}" for p in paths]), labels))


def arrays(path: Path, **arrays) -> Path:
    """A .npz or .pt file holding the given arrays."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".npz":
        np.savez(path, **arrays)
    else:
        torch.save({k: torch.as_tensor(v) if isinstance(v, np.ndarray) else v for k, v in arrays.items()}, path)
    return path


def iwildcam(root: Path, cameras: dict[str, list[int]], per_camera: int = 4, num_classes: int = 5) -> dict:
    """iwildcam_v2.0/: metadata.csv (WILDS' columns) and train/<filename> JPEGs. `cameras` maps a WILDS split
    (train, val, test, id_test, ...) to its camera ids (location_remapped); each camera gets `per_camera`
    images with labels cycling through `num_classes` (offset by the camera, so cameras differ)."""
    base = Path(root) / "iwildcam_v2.0"
    rows = ["split,location_remapped,y,filename,sequence"]
    labels: dict[str, list[int]] = {}
    for split, cams in cameras.items():
        for cam in cams:
            for i in range(per_camera):
                name = f"{split}_{cam}_{i}.jpg"
                y = (cam + i) % num_classes
                _image(base / "train" / name, 30 + i, 40, 3, seed=1000 * cam + i)
                rows.append(f"{split},{cam},{y},{name},seq{cam}")
                labels.setdefault(split, []).append(y)
    (base / "metadata.csv").write_text("\n".join(rows) + "\n")
    return {"labels": labels}
