"""The weighted mean: sum_i w_i x_i / sum_i w_i with the method's weights (FedAvg with w_i = n_i), the default."""
from __future__ import annotations

from torch import Tensor

from fl.core.aggregation import Uploads
from fl.core.registry import register_aggregator


@register_aggregator("mean", streams=True)
def mean(uploads: Uploads, start: dict[str, Tensor], s) -> dict[str, Tensor]:
    """The uploads' weighted mean, summed in float64 as clients finish (memory does not grow with the round's
    clients); integer tensors (counters) take their maximum."""
    return uploads.mean()
