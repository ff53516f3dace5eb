"""Datasets registered by name; `build_data(cfg)` turns a config into per-client tensors."""
from __future__ import annotations

import numpy as np
from omegaconf import DictConfig

from fl.data.base import ClientData, FederatedData, Split, batch_indices
from fl.data import embedded, partition
from fl.registry import DATASETS, register_dataset
from fl.seeding import derive_seed

__all__ = ["ClientData", "FederatedData", "Split", "batch_indices", "build_data"]


def split_pool(name: str, x, y, num_classes: int, cfg: DictConfig, seed: int) -> FederatedData:
    """Partition a labelled pool over clients, then split each client into its own train/test."""
    d = cfg.data
    rng = np.random.default_rng(derive_seed(seed, 0, -1, "partition"))
    if d.partition == "iid":
        parts = partition.iid(y, d.num_clients, rng)
    else:
        parts = partition.dirichlet(y, d.num_clients, d.dirichlet_alpha, rng, d.min_client_size)
    clients = []
    for idx in parts:
        tr, te = partition.train_test_split(idx, d.test_fraction, rng)
        clients.append(ClientData(Split(x[tr], y[tr]), Split(x[te], y[te])))
    return FederatedData(name, num_classes, tuple(x.shape[1:]), clients, partition=parts)


@register_dataset("embedded")
def embedded_images(cfg: DictConfig, seed: int) -> FederatedData:
    d = cfg.data
    x, y = embedded.load_or_generate(d.root, d.num_classes, d.samples_per_class, d.channels, d.image_size, d.noise)
    return split_pool("embedded", x, y, d.num_classes, cfg, seed)


def build_data(cfg: DictConfig) -> FederatedData:
    seed = cfg.data.partition_seed if cfg.data.partition_seed is not None else cfg.seed
    return DATASETS[cfg.data.name](cfg, seed)
