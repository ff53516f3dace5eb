"""Seeded mini-batches of a client's data, and the training-time augmentations applied to them."""
from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Optional

import torch
from torch import Tensor

from fl.core.registry import AUGMENTATIONS, load_plugins


def batch_indices(n: int, batch_size: int, gen: torch.Generator, *, epochs: Optional[int] = None,
                  steps: Optional[int] = None, drop_last: bool = False) -> Iterator[tuple[int, Optional[Tensor]]]:
    """Shuffled mini-batches as (epoch, indices): `epochs` full passes, or exactly `steps` batches
    (reshuffling at each pass). Each completed pass ends with (epoch, None)."""
    if n == 0:
        return
    batch_size = min(batch_size, n)
    done, epoch = 0, 0
    while True:
        perm = torch.randperm(n, generator=gen)
        stop = n - n % batch_size if drop_last else n
        for start in range(0, stop, batch_size):
            if steps is not None and done >= steps:
                return
            yield epoch, perm[start:start + batch_size]
            done += 1
        yield epoch, None
        epoch += 1
        if epoch >= epochs if steps is None else done >= steps:
            return


def count_batches(n: int, batch_size: int, epochs: Optional[int], steps: Optional[int], drop_last: bool) -> int:
    """How many batches `batch_indices` yields for these arguments, without drawing them: a client smaller than a
    batch takes one batch of all its samples, drop_last or not; only a client without samples takes none."""
    if n == 0:
        return 0
    if steps is not None:
        return steps
    b = min(batch_size, n)
    return epochs * (n // b if drop_last else math.ceil(n / b))


def augment(x: Tensor, names, gen: torch.Generator) -> Tensor:
    """Apply the named augmentations (`data.augment`, registered by fl/data/augment.py) in order; inputs that
    are not image batches [B, C, H, W] are refused."""
    if names and x.dim() != 4:
        raise ValueError(f"data.augment={list(names)} needs image batches [B, C, H, W]; got shape {tuple(x.shape)}")
    if names:
        load_plugins()  # fl.data registers the augmentations
    for name in names:
        x = AUGMENTATIONS[name](x, gen)
    return x
