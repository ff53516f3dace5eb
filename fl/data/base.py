"""What a loader returns (a Pool, before it is split over the clients) and how a missing dataset is reported."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from torch import Tensor

from fl.config import ConfigError
from fl.core import Split


class DataError(ConfigError):
    """A missing or malformed dataset: one line naming the path, the layout expected and how to get it."""

    def __init__(self, path, expected: str, obtain: str):
        super().__init__(f"dataset not found or malformed at {path}: expected {expected}; {obtain}")


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


def check_no_variant(d, dataset: str) -> None:
    """A loader without variants refuses `data.variant` (EMNIST's split is the one that has them)."""
    if d.variant is not None:
        raise ConfigError(f"data.variant={d.variant!r} is not used by {dataset}; choices: null")
