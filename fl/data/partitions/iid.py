"""IID: the candidates shuffled and cut into near-equal parts."""
from __future__ import annotations

import numpy as np

from fl.config import ConfigError
from fl.core.registry import register_partition
from fl.data.base import Candidates


def iid(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    if num_clients > n:
        raise ConfigError(f"data.num_clients={num_clients} exceeds the {n} samples available (each client needs one)")
    return [np.sort(part) for part in np.array_split(rng.permutation(n), num_clients)]


@register_partition("iid")
def iid_partition(c: Candidates, num_clients: int, s, rng: np.random.Generator) -> list[np.ndarray]:
    """IID: the samples shuffled and cut into near-equal parts."""
    return iid(len(c), num_clients, rng)
