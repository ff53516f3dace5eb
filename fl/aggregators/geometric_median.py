"""The geometric median by the smoothed Weiszfeld algorithm: Robust Federated Aggregation (RFA; Pillutla, Kakade and
Harchaoui, "Robust Aggregation for Federated Learning", IEEE TSP 2022)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fl.config import param
from fl.core.aggregation import Uploads, combination, distances_to, in_upload_dtypes
from fl.core.registry import register_aggregator


@dataclass
class Settings:
    iterations: int = param(4, ge=1, help="Weiszfeld iterations at most (RFA: a few suffice)")
    nu: float = param(1e-6, gt=0.0, help="smoothing: a distance below nu counts as nu, so an upload at the current "
                      "estimate does not divide by zero")
    tolerance: float = param(1e-6, ge=0.0, help="stop once an iteration lowers the objective sum_i a_i ||z - x_i|| "
                             "by less than this fraction of it; 0 = always run every iteration")


def objective(uploads: Uploads, alphas: Tensor, z: dict[str, Tensor]) -> float:
    return float((alphas * distances_to(uploads, z)).sum())


@register_aggregator("geometric_median", Settings, robust=True)
def geometric_median(uploads: Uploads, start: dict[str, Tensor], s) -> dict[str, Tensor]:
    """The geometric median argmin_z sum_i a_i ||z - x_i|| of the uploads (RFA), weighted by the method's weights
    a_i (n_i by default) as RFA weighs its clients; smoothed Weiszfeld iterations from the weighted mean."""
    weights = torch.tensor([u.weight for u in uploads.clients], dtype=torch.float64, device=uploads.device)
    alphas = weights / weights.sum()
    z = combination(uploads, alphas)
    value = objective(uploads, alphas, z)
    for _ in range(int(s.iterations)):
        betas = alphas / distances_to(uploads, z).clamp(min=float(s.nu))
        z = combination(uploads, betas / betas.sum())
        previous, value = value, objective(uploads, alphas, z)
        if abs(previous - value) < float(s.tolerance) * value:
            break
    return in_upload_dtypes(uploads, z)
