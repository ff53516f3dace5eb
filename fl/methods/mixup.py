"""Input mixup (Zhang et al., 2018) as FedACD's local training uses it (Zhou et al. 2025, Sec. 3.3) and its Table 5's
baselines "w/" it: each minibatch mixed with a permutation of itself, x = mu x + (1 - mu) x[perm], one
mu ~ Beta(alpha, alpha) per batch; a loss then weighs the batch's labels by mu and its partners' by 1 - mu."""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from fl.core import derive_seed, generator


class InputMixup:
    """The draws of one client's local training in one round, seeded by (seed, round, client, purpose): the same on
    any process and after a resume."""

    def __init__(self, alpha: float, seed: int, round_idx: int, client: int, purpose: str):
        self.alpha = alpha
        self.rng = np.random.default_rng(derive_seed(seed, round_idx, client, purpose))
        self.perm = generator(seed, round_idx, client, f"{purpose}-perm")

    def __call__(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, float]:
        """(mixed inputs, the partners' labels, mu)."""
        mu = float(self.rng.beta(self.alpha, self.alpha))
        perm = torch.randperm(len(y), generator=self.perm).to(y.device)
        return mu * x + (1.0 - mu) * x[perm], y[perm], mu
