"""Pathological label skew: each client holds a few classes (FedMosaic's hybrid split, NIID-Bench's #C=k)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fl.config import ConfigError, param
from fl.core.registry import register_partition
from fl.data.base import Candidates


@dataclass
class Settings:
    classes_per_client: int = param(2, ge=1, help="classes held by each client")
    class_assignment: str = param("round_robin", choices=["round_robin", "random"],
                                  help="round_robin: consecutive classes of a random permutation; "
                                  "random: NIID-Bench #C=k (class p mod K plus random others)")


def class_sets(num_clients: int, num_classes: int, per_client: int, rng: np.random.Generator,
               assignment: str) -> list[np.ndarray]:
    """Which classes each client holds.
    round_robin: clients take consecutive pairs (for C=2) of a random class permutation, so classes are
      used equally often and, when M*C = K, cover the classes disjointly (FedMosaic's hybrid split);
    random: NIID-Bench '#C=k' (FedPALS): client p holds class p mod K plus C-1 others drawn at random."""
    if per_client > num_classes:
        raise ConfigError(f"data.partition.classes_per_client={per_client} exceeds the {num_classes} classes available")
    if assignment == "round_robin":
        perm = rng.permutation(num_classes)
        return [np.sort(perm[(np.arange(per_client) + p * per_client) % num_classes]) for p in range(num_clients)]
    sets = []
    for p in range(num_clients):
        first = p % num_classes
        others = rng.choice(np.delete(np.arange(num_classes), first), size=per_client - 1, replace=False)
        sets.append(np.sort(np.concatenate([[first], others])))
    return sets


def classes(labels: np.ndarray, num_clients: int, per_client: int, rng: np.random.Generator,
            assignment: str = "round_robin") -> list[np.ndarray]:
    """Each client holds `per_client` classes; the samples of a class are split into near-equal disjoint chunks
    among the clients holding it."""
    present = np.unique(labels)
    sets = class_sets(num_clients, len(present), per_client, rng, assignment)
    holders: dict[int, list[int]] = {}
    for client, s in enumerate(sets):
        for k in s:
            holders.setdefault(int(present[k]), []).append(client)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c, clients in holders.items():
        idx = rng.permutation(np.flatnonzero(labels == c))
        for client, chunk in zip(clients, np.array_split(idx, len(clients))):
            parts[client].append(chunk)
    empty = [i for i, p in enumerate(parts) if not sum(len(c) for c in p)]
    if empty:
        raise ConfigError(f"clients {empty[:5]} got no samples; lower data.num_clients or raise the dataset size")
    return [np.sort(np.concatenate(p)) for p in parts]


@register_partition("classes", Settings)
def classes_partition(c: Candidates, num_clients: int, s, rng: np.random.Generator) -> list[np.ndarray]:
    """Pathological label skew: each client holds classes_per_client classes, their samples shared among holders."""
    return classes(c.labels, num_clients, s.classes_per_client, rng, s.class_assignment)
