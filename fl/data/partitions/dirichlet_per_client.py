"""FedPALS' per-client label skew: each client draws its own label proportions from a Dirichlet."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from fl.config import param
from fl.core.registry import register_partition
from fl.data.base import Candidates, check_enough


@dataclass
class Settings:
    alpha: float = param(0.5, gt=0.0, help="concentration of each client's Dirichlet label proportions")
    samples_per_client: Optional[int] = param(None, ge=1, help="samples per client (default: the pool divided "
                                              "evenly)")


def dirichlet_per_client(labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator,
                         size: int) -> list[np.ndarray]:
    """Client i's label proportions p_i ~ Dir_K(alpha); it draws size * p_i(k) samples of class k without
    replacement (renormalising over the classes not yet exhausted)."""
    classes = np.unique(labels)
    check_enough(len(labels), num_clients, size, "data.partition.samples_per_client")
    pools = {c: list(rng.permutation(np.flatnonzero(labels == c))) for c in classes}
    parts = []
    for _ in range(num_clients):
        want = np.round(rng.dirichlet(np.full(len(classes), alpha)) * size).astype(int)
        taken: list[int] = []
        deficit = 0
        for c, k in zip(classes, want):
            got = pools[c][:k]
            pools[c] = pools[c][k:]
            taken += got
            deficit += k - len(got)
        while deficit > 0:  # a class ran out: fill from the others in proportion to what is left
            left = np.array([len(pools[c]) for c in classes], dtype=float)
            if left.sum() == 0:
                break
            c = classes[rng.choice(len(classes), p=left / left.sum())]
            taken.append(pools[c].pop(0))
            deficit -= 1
        parts.append(np.sort(np.array(taken, dtype=np.int64)))
    return parts


@register_partition("dirichlet_per_client", Settings)
def dirichlet_per_client_partition(c: Candidates, num_clients: int, s, rng: np.random.Generator) -> list[np.ndarray]:
    """FedPALS' label skew: client i draws samples_per_client samples with label proportions ~ Dir_K(alpha)."""
    return dirichlet_per_client(c.labels, num_clients, s.alpha, rng, s.samples_per_client or len(c) // num_clients)
