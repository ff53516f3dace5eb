"""Seeded client partitions of a labelled pool (numpy Generator: public Dirichlet sampling)."""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor


def iid(labels: Tensor, num_clients: int, rng: np.random.Generator) -> list[Tensor]:
    perm = rng.permutation(len(labels))
    return [torch.from_numpy(np.sort(part)) for part in np.array_split(perm, num_clients)]


def dirichlet(labels: Tensor, num_clients: int, alpha: float, rng: np.random.Generator,
              min_size: int = 10, max_tries: int = 1000) -> list[Tensor]:
    """Label skew: each class's samples go to clients in proportions drawn from Dir(alpha).

    The whole draw is repeated until every client holds at least `min_size` samples.
    """
    labels_np = labels.cpu().numpy()
    num_classes = int(labels_np.max()) + 1
    if min_size * num_clients > len(labels_np):
        raise ValueError(f"data.min_client_size={min_size} x data.num_clients={num_clients} exceeds "
                         f"the {len(labels_np)} samples available")
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in range(num_classes):
            idx = rng.permutation(np.flatnonzero(labels_np == c))
            props = rng.dirichlet(np.full(num_clients, alpha))
            cuts = np.round(np.cumsum(props) * len(idx)).astype(int)[:-1]
            for client, chunk in enumerate(np.split(idx, cuts)):
                parts[client].append(chunk)
        sizes = [sum(len(p) for p in client) for client in parts]
        if min(sizes) >= min_size:
            return [torch.from_numpy(np.sort(np.concatenate(client))) for client in parts]
    raise ValueError(f"no Dirichlet(alpha={alpha}) split gave every client >= {min_size} samples in "
                     f"{max_tries} tries; lower data.min_client_size or raise data.dirichlet_alpha")


def train_test_split(indices: Tensor, test_fraction: float, rng: np.random.Generator) -> tuple[Tensor, Tensor]:
    """Each client's own test split follows its own label distribution (random, not stratified)."""
    perm = indices[torch.from_numpy(rng.permutation(len(indices)))]
    n_test = max(1, int(round(len(indices) * test_fraction)))
    return perm[n_test:].sort().values, perm[:n_test].sort().values
