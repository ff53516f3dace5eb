"""Label-sorted shards (McMahan et al. 2017; fedlab's `shards_partition`, FedDRM's S-SPC)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fl.config import ConfigError, param
from fl.core.registry import register_partition
from fl.data.base import Candidates


@dataclass
class Settings:
    shards_per_client: int = param(5, ge=1, help="label-sorted shards per client (FedDRM's S-SPC)")


def shards(labels: np.ndarray, num_clients: int, per_client: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Sort by label, cut into M*S equal shards, deal S random shards to each client."""
    num_shards = num_clients * per_client
    if num_shards > len(labels):
        raise ConfigError(f"data.num_clients x data.partition.shards_per_client = {num_shards} shards exceed the "
                          f"{len(labels)} samples")
    order = np.argsort(labels, kind="stable")
    size = len(labels) // num_shards
    shard_ids = rng.permutation(num_shards)
    return [np.sort(np.concatenate([order[s * size:(s + 1) * size] for s in shard_ids[c::num_clients]]))
            for c in range(num_clients)]


@register_partition("shards", Settings)
def shards_partition(c: Candidates, num_clients: int, s, rng: np.random.Generator) -> list[np.ndarray]:
    """Label-sorted shards: the samples sorted by label, cut into equal shards, shards_per_client dealt to each."""
    return shards(c.labels, num_clients, s.shards_per_client, rng)
