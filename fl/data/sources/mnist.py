"""Fashion-MNIST and EMNIST through torchvision, from its raw idx layout.

torchvision's FashionMNIST and EMNIST only check that the raw files exist (no md5 on load), so their
classes are used as they are. Images stay single-channel uint8 [N, 1, 28, 28], as the papers' MNIST
networks expect (FedMosaic, Sec. 8: grayscale 28x28 FashionMNIST; pFedFDA, App. C.1: 28x28 grayscale EMNIST).

EMNIST's default split is "byclass", the 62 classes pFedFDA uses (Sec. 5.1). pFedFDA's FEMNIST is
partitioned by writer, which torchvision's EMNIST files do not record: that needs LEAF's FEMNIST,
e.g. converted to the `arrays` format. EMNIST stores images transposed; they are turned upright here.
"letters" labels are shifted from 1..26 to 0..25 (torchvision keeps an empty class "N/A" at 0).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig
from torch import Tensor

from fl.config import ConfigError, param
from fl.core import Split
from fl.core.registry import register_dataset
from fl.data.base import DataError, Pool, download_param, image_size_param, removed_if_failed

MEAN, STD = (0.5,), (0.5,)  # Normalize(0.5, 0.5) -> [-1, 1]: FedMosaic Sec. 8 (FMNIST), pFedFDA Sec. 5.1
NATIVE_SIZE = 28
EMNIST_SPLITS = ("byclass", "bymerge", "balanced", "letters", "digits", "mnist")
DEFAULT_EMNIST_SPLIT = "byclass"


@dataclass
class Settings:
    """data.* keys of Fashion-MNIST (besides data.root)."""
    download: bool = download_param()
    image_size: Optional[int] = image_size_param(NATIVE_SIZE)


@dataclass
class EMNISTSettings(Settings):
    """data.* keys of EMNIST (besides data.root)."""
    variant: Optional[str] = param(None, choices=list(EMNIST_SPLITS),
                                   help=f"the EMNIST split; null = {DEFAULT_EMNIST_SPLIT} (pFedFDA's 62 classes)")


def _torchvision(d: DictConfig, cls_name: str, files: list[str], **kw) -> tuple[object, object]:
    """(train, test) torchvision datasets; any failure becomes a one-line DataError."""
    import torchvision.datasets as tvd

    raw = Path(d.root) / cls_name / "raw"
    layout = f"torchvision's {cls_name}/raw/ with {', '.join(files)}"
    if not d.download and not all((raw / f).is_file() for f in files):
        missing = next(raw / f for f in files if not (raw / f).is_file())
        raise DataError(missing if raw.is_dir() else Path(d.root) / cls_name, layout,
                        "set data.download=true to fetch it with torchvision")
    try:
        cls = getattr(tvd, cls_name)
        with removed_if_failed(raw) if d.download else contextlib.nullcontext():
            return (cls(d.root, train=True, download=d.download, **kw),
                    cls(d.root, train=False, download=False, **kw))
    except Exception as err:  # a malformed idx file, or a failed download
        why = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise DataError(raw, f"{layout} ({why})", "set data.download=true to fetch it with torchvision, or "
                                                  "delete the damaged files and fetch them again") from None


def _images(data: Tensor, d: DictConfig, transpose: bool) -> Tensor:
    x = data.transpose(1, 2) if transpose else data
    x = x.unsqueeze(1).contiguous()
    size = int(d.image_size or NATIVE_SIZE)
    if size != NATIVE_SIZE:
        from torchvision.transforms.v2.functional import resize
        x = resize(x, [size, size], antialias=True)
    return x


def _pool(name: str, train, test, d: DictConfig, class_names: list[str], transpose: bool = False,
          label_offset: int = 0) -> Pool:
    splits = []
    for ds in (train, test):
        y = ds.targets.long() - label_offset
        if len(y) != len(ds.data) or (len(y) and (y.min() < 0 or y.max() >= len(class_names))):
            raise DataError(Path(d.root) / type(ds).__name__ / "raw",
                            f"as many labels in [0, {len(class_names)}) as images", "fetch the files again")
        splits.append(Split(_images(ds.data, d, transpose), y))
    return Pool(name, splits[0], splits[1], len(class_names), class_names, mean=MEAN, std=STD)


@register_dataset("fmnist", Settings)
def load_fmnist(d: DictConfig) -> Pool:
    files = [f"{s}-{k}-ubyte" for s in ("train", "t10k") for k in ("images-idx3", "labels-idx1")]
    train, test = _torchvision(d, "FashionMNIST", files)
    return _pool("fmnist", train, test, d, list(train.classes))


@register_dataset("emnist", EMNISTSettings)
def load_emnist(d: DictConfig) -> Pool:
    split = d.variant if d.variant is not None else DEFAULT_EMNIST_SPLIT
    if split not in EMNIST_SPLITS:
        raise ConfigError(f"data.variant={split!r} is not an EMNIST split; choices: {', '.join(EMNIST_SPLITS)}")
    files = [f"emnist-{split}-{s}-{k}-ubyte" for s in ("train", "test") for k in ("images-idx3", "labels-idx1")]
    train, test = _torchvision(d, "EMNIST", files, split=split)
    classes = list(train.classes)
    offset = 1 if split == "letters" else 0
    return _pool("emnist", train, test, d, classes[offset:], transpose=True, label_offset=offset)
