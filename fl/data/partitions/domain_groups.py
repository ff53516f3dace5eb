"""Whole domains dealt to the clients (FedPALS' iWildCam split: each client a group of cameras)."""
from __future__ import annotations

import numpy as np

from fl.config import ConfigError
from fl.core.registry import register_partition
from fl.data.base import Candidates


@register_partition("domain_groups")
def domain_groups(c: Candidates, num_clients: int, s, rng: np.random.Generator) -> list[np.ndarray]:
    """Whole domains, shuffled and dealt round-robin to the clients (FedPALS' iWildCam: cameras)."""
    domains = c.need_domains("domain_groups")
    doms = rng.permutation(np.unique(domains))
    if len(doms) < num_clients:
        raise ConfigError(f"data.partition.name=domain_groups deals whole domains to clients: data.num_clients="
                          f"{num_clients} exceeds the {len(doms)} domains of data.name={c.dataset!r}")
    return [np.flatnonzero(np.isin(domains, doms[k::num_clients])) for k in range(num_clients)]
