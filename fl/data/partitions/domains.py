"""Clients carved out of each domain, with a label skew inside each (FedBN's and FedMosaic's multi-domain splits)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fl.config import ConfigError, param
from fl.core.registry import register_partition
from fl.data.base import Candidates
from fl.data.partitions import classes, dirichlet
from fl.data.partitions.iid import iid


@dataclass
class Settings(dirichlet.Settings, classes.Settings):
    """dirichlet's settings apply with within_domain=dirichlet, classes' with within_domain=classes."""
    clients_per_domain: int = param(1, ge=1, help="clients carved out of each domain")
    within_domain: str = param("iid", choices=["iid", "dirichlet", "classes"],
                               help="label skew inside each domain (classes = FedMosaic's hybrid)")


@register_partition("domains", Settings)
def domains_partition(c: Candidates, num_clients: int, s, rng: np.random.Generator) -> list[np.ndarray]:
    """clients_per_domain clients per domain, with the within_domain label skew inside each domain."""
    domains, labels = c.need_domains("domains"), c.labels
    parts = []
    for dom in np.unique(domains):
        where = np.flatnonzero(domains == dom)
        sub = iid(len(where), s.clients_per_domain, rng) if s.within_domain == "iid" else (
            classes.classes(labels[where], s.clients_per_domain, s.classes_per_client, rng, s.class_assignment)
            if s.within_domain == "classes" else
            dirichlet.dirichlet(labels[where], s.clients_per_domain, s.alpha, rng, s.min_client_size, s.balance))
        parts += [where[p] for p in sub]
    if num_clients != len(parts):
        raise ConfigError(f"data.num_clients={num_clients} must equal the number of domains x "
                          f"data.partition.clients_per_domain = {len(parts)} for data.partition.name=domains")
    return parts
