"""Krum and multi-Krum (Blanchard et al. 2017, "Machine Learning with Adversaries: Byzantine Tolerant Gradient
Descent", Section 4)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from fl.config import param
from fl.core.aggregation import Uploads, combination, in_upload_dtypes, pairwise_sq_distances
from fl.core.registry import register_aggregator


@dataclass
class Settings:
    f: int = param(1, ge=0, help="Byzantine clients tolerated: each upload is scored by the squared distances to its "
                   "n - f - 2 nearest others (Krum needs n > 2f + 2 clients a round)")
    m: int = param(1, ge=1, help="multi-Krum: the unweighted mean of the m uploads with the lowest scores; 1 = Krum, "
                   "the single best-scored upload")


def check(s, clients: int) -> Optional[str]:
    if clients <= 2 * s.f + 2:
        return (f"server.aggregator.f={s.f} needs more than 2f+2 = {2 * s.f + 2} clients a round (Blanchard et al. "
                f"2017), and this config trains {clients}: lower server.aggregator.f, or raise data.num_clients or "
                "trainer.participation")
    if s.m > clients:
        return f"server.aggregator.m={s.m} exceeds the {clients} clients a round; it must be <= {clients}"
    return None


def krum_scores(sq_dist: Tensor, f: int) -> Tensor:
    """Each upload's score: the sum of its squared distances to its n - f - 2 nearest other uploads. A round with
    n <= 2f + 2 clients (possible under trainer.sampling=bernoulli) counts at least the nearest one."""
    n = sq_dist.shape[0]
    k = min(n - 1, max(1, n - f - 2))
    others = sq_dist + torch.diag(torch.full((n,), float("inf"), dtype=sq_dist.dtype, device=sq_dist.device))
    return others.sort(dim=1).values[:, :k].sum(dim=1)


@register_aggregator("krum", Settings, check=check, robust=True)
def krum(uploads: Uploads, start: dict[str, Tensor], s) -> dict[str, Tensor]:
    """Krum / multi-Krum (Blanchard et al. 2017): the upload (or the unweighted mean of the m uploads) closest to
    its n - f - 2 nearest others; ties go to the lower client id."""
    scores = krum_scores(pairwise_sq_distances(uploads), int(s.f))
    chosen = scores.argsort(stable=True)[:min(int(s.m), len(scores))]
    coefficients = torch.zeros_like(scores)
    coefficients[chosen] = 1.0 / len(chosen)
    return in_upload_dtypes(uploads, combination(uploads, coefficients))
