"""The pipeline's second stage: the registered `data.partition` splits what `hold_out` left free among the clients
(and one more part for a target made like them, data.target.distribution=partition), then each client loses its
data.drop_labels."""
from __future__ import annotations

import numpy as np
from omegaconf import DictConfig

from fl.config import ConfigError
from fl.core.registry import PARTITIONS
from fl.core.seeding import data_stream
from fl.data.base import Candidates
from fl.data.held_out import HeldOut


def client_parts(h: HeldOut, d: DictConfig, seed: int) -> list[np.ndarray]:
    """Each part's positions in `h.source`: one per client, then the target's when it is a partition."""
    if d.partition.labels == "fine" and h.fine is None:
        raise ConfigError(f"data.partition.labels=fine needs a dataset with fine labels (cifar20); "
                          f"data.name={d.name!r} has none")
    avail = np.flatnonzero(h.free)
    labels = (h.fine if d.partition.labels == "fine" else h.source.y).numpy()[avail]
    domains = None if h.source.domain is None else h.source.domain.numpy()[avail]
    num_parts = d.num_clients + (1 if d.target.distribution == "partition" else 0)
    scheme = PARTITIONS[d.partition.name].fn
    parts = [avail[p] for p in scheme(Candidates(labels, domains, d.name), num_parts, d.partition,
                                      data_stream(seed, "partition"))]
    if d.drop_labels is not None:  # per-client labels removed (FedPALS' PACS: client k loses label k); the target's
        # part keeps all
        y = h.source.y.numpy()
        parts = [p[~np.isin(y[p], np.atleast_1d(drop))] for p, drop in zip(parts, d.drop_labels)] + \
            parts[len(d.drop_labels):]
    return parts
