"""The pipeline's third stage: the target client (FedPALS). Its distribution and validation set come from
`hold_out` or, with data.target.distribution=partition, from one more part made like the clients'; its test set is
drawn from the official test split with its label mix, apart from its validation set. With data.target.clients_follow
(FedPALS' Oracle) every client's data is redrawn with the target's label mix."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from omegaconf import DictConfig

from fl.config import ConfigError
from fl.core import Target
from fl.core.sampling import proportional_sample
from fl.core.seeding import data_stream
from fl.data.held_out import HeldOut


@dataclass
class TargetStage:
    parts: list[np.ndarray]  # the clients' parts, without the target's
    target: Optional[Target]
    index_lists: list[np.ndarray]  # the target's validation and test positions (for the partition fingerprint)


def split_off_target(h: HeldOut, parts: list[np.ndarray], d: DictConfig, seed: int) -> TargetStage:
    val_split, target_val, target_dist = h.official, h.target_val, h.target_dist
    if d.target.distribution == "partition":  # the extra part is the target; its samples are its validation set
        target_val, val_split = parts[-1], h.source
        parts = parts[:-1]
        target_dist = np.bincount(h.source.y.numpy()[target_val], minlength=h.num_classes) / len(target_val)
    if d.target.clients_follow:
        usable = h.free.copy()
        if val_split is h.source:
            usable[target_val] = False
        parts = _follow_target(parts, h.source.y.numpy(), usable, target_dist, seed)
    if target_dist is None or h.domain_target is not None:  # no target, or a held-out domain (made by hold_out)
        return TargetStage(parts, h.domain_target, [])
    allowed = None if h.target_taken is None else ~h.target_taken
    test_pos = proportional_sample(h.official.y.numpy(), target_dist, data_stream(seed, "target-test"), allowed)
    target = Target(torch.from_numpy(target_dist), val_split.subset(torch.from_numpy(target_val)),
                    h.official.subset(torch.from_numpy(test_pos)))
    return TargetStage(parts, target, [target_val, test_pos])


def _follow_target(parts: list[np.ndarray], labels: np.ndarray, avail: np.ndarray, target: Optional[np.ndarray],
                   seed: int) -> list[np.ndarray]:
    """Each client keeps its size n_i (scaled down if the pool runs short) but draws its samples from the
    whole usable pool, without replacement across clients, with the target's label proportions."""
    if target is None:
        raise ConfigError("data.target.clients_follow=true needs data.target.distribution or data.target.domain")
    have = np.bincount(labels[avail], minlength=len(target))
    sizes = np.array([len(p) for p in parts], dtype=float)
    need = target * sizes.sum()
    scale = min(1.0, min(have[k] / need[k] for k in np.flatnonzero(target > 0)))
    if scale * sizes.min() < 1:
        raise ConfigError("data.target.clients_follow: the pool outside the target's own data holds too few samples "
                          f"of the target's classes {np.flatnonzero(target > 0).tolist()} to give every client one")
    rng = data_stream(seed, "oracle")
    pools = {k: list(rng.permutation(np.flatnonzero(avail & (labels == k)))) for k in np.flatnonzero(target > 0)}
    out = []
    for size in sizes:  # floor per class, so the pool never runs out part-way
        pos = []
        for k, pool in pools.items():
            take = int(target[k] * size * scale)
            pos += pool[:take]
            del pool[:take]
        out.append(np.sort(np.array(pos, dtype=np.int64)))
    return out
