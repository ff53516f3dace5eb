"""Norm bounding of the clients' updates (Sun et al. 2019, "Can You Really Backdoor Federated Learning?",
Section 4: norm thresholding)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fl.config import param
from fl.core.aggregation import Uploads, combination, distances_to, in_upload_dtypes
from fl.core.registry import register_aggregator


@dataclass
class Settings:
    max_norm: float = param(1.0, gt=0.0, help="M: each client's update x_i - x (x: the model the round started from) "
                            "is scaled to norm at most M before the weighted mean")


@register_aggregator("norm_clip", Settings)
def norm_clip(uploads: Uploads, start: dict[str, Tensor], s) -> dict[str, Tensor]:
    """x + sum_i w_i (x_i - x) min(1, M / ||x_i - x||) / sum_i w_i (Sun et al. 2019): the weighted mean of the
    updates, each clipped to norm M, added to the model the round started from."""
    weights = torch.tensor([u.weight for u in uploads.clients], dtype=torch.float64, device=uploads.device)
    norms = distances_to(uploads, start)
    scale = torch.clamp(float(s.max_norm) / norms, max=1.0)  # a zero update (norm 0) divides to inf, clamped to 1
    return in_upload_dtypes(uploads, combination(uploads, weights * scale / weights.sum(), origin=start))
