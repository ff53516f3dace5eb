"""Label skew by a Dirichlet draw per class (Yurochkin et al. 2019; fedlab's `hetero_dir_partition`)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fl.config import ConfigError, param
from fl.core.registry import register_partition
from fl.data.base import Candidates, check_enough


@dataclass
class Settings:
    alpha: float = param(0.5, gt=0.0, help="concentration of the Dirichlet label split")
    balance: bool = param(False, help="a client already holding N/M samples gets no more (fedlab)")
    min_client_size: int = param(10, ge=1, help="the split is redrawn until every client has this many samples")


def dirichlet(labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator, min_size: int = 10,
              balance: bool = False, max_tries: int = 1000) -> list[np.ndarray]:
    """For each class, proportions over the clients ~ Dir(alpha); redrawn whole until every client holds at least
    `min_size` samples. `balance`: a client already holding N/M samples gets no more (fedlab's and pFedFDA's
    trick)."""
    n = len(labels)
    check_enough(n, num_clients, min_size, "data.partition.min_client_size")
    members = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    for _ in range(max_tries):
        # a draw is kept as each class's permutation and cuts; the clients' pieces are cut only from the draw that
        # is accepted (1000 clients redraw about 170 times at min_size 20: cutting every draw took most of the time)
        drawn: list[tuple[np.ndarray, np.ndarray]] = []
        sizes = np.zeros(num_clients, dtype=np.int64)
        for members_c in members:
            idx = rng.permutation(members_c)
            props = rng.dirichlet(np.full(num_clients, alpha))
            if balance:
                props = props * (sizes < n / num_clients)
                props = props / props.sum() if props.sum() > 0 else np.full(num_clients, 1 / num_clients)
            cuts = np.round(np.cumsum(props) * len(idx)).astype(int)[:-1]
            sizes += np.diff(np.clip(cuts, 0, len(idx)), prepend=0, append=len(idx))  # the pieces' lengths
            drawn.append((idx, cuts))
        if sizes.min() >= min_size:
            parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
            for idx, cuts in drawn:
                for client, chunk in enumerate(np.split(idx, cuts)):
                    parts[client].append(chunk)
            return [np.sort(np.concatenate(client)) for client in parts]
    raise ConfigError(f"no Dirichlet(alpha={alpha}) split gave every one of {num_clients} clients >= {min_size} "
                      f"samples in {max_tries} draws; lower data.partition.min_client_size or raise "
                      "data.partition.alpha")


@register_partition("dirichlet", Settings)
def dirichlet_partition(c: Candidates, num_clients: int, s, rng: np.random.Generator) -> list[np.ndarray]:
    """Label skew: each class's samples dealt to the clients in Dirichlet(alpha) proportions."""
    return dirichlet(c.labels, num_clients, s.alpha, rng, s.min_client_size, s.balance)
