"""From a loaded Pool to FederatedData, a pipeline of one call per stage: hold out what the clients never see
(fl/data/held_out.py), partition the rest (fl/data/client_parts.py, the registered data.partition), split off the
target client (fl/data/target.py), split each client's part into train / test / val (fl/data/client_splits.py), then
change each client's images (fl/data/client_images.py, the registered data.client_transform). Every draw comes from
the run's partition seed, one stream per purpose, so switching one option (say, a public set) does not reshuffle the
others."""
from __future__ import annotations

import numpy as np
import torch
from omegaconf import DictConfig

from fl.core import FederatedData
from fl.data.base import Pool
from fl.data.client_images import change_images
from fl.data.client_parts import client_parts
from fl.data.client_splits import split_clients
from fl.data.held_out import hold_out
from fl.data.target import split_off_target


def federate(pool: Pool, d: DictConfig, seed: int) -> FederatedData:
    h = hold_out(pool, d, seed)
    parts = client_parts(h, d, seed)
    t = split_off_target(h, parts, d, seed)
    clients, index_lists = split_clients(t.parts, h, d, seed)
    batch_transform = change_images(clients, d, seed)
    index_lists += t.index_lists + ([h.public_pos] if h.public_pos is not None else [])
    return FederatedData(pool.name, pool.num_classes, tuple(h.source.x.shape[1:]), clients,
                         partition=[torch.from_numpy(np.asarray(i, dtype=np.int64)) for i in index_lists],
                         global_test=h.official,  # the dataset's own (or held-out) test set: the global model's
                         public=h.public, target=t.target, mean=pool.mean, std=pool.std,
                         class_names=pool.class_names, domain_names=pool.domain_names,
                         num_new_clients=d.new_clients.count, batch_transform=batch_transform)
