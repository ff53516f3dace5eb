"""The coordinate-wise median (Yin et al. 2018, "Byzantine-Robust Distributed Learning: Towards Optimal Statistical
Rates", Definition 1)."""
from __future__ import annotations

from torch import Tensor

from fl.core.aggregation import Uploads, coordinatewise, median_of_rows
from fl.core.registry import register_aggregator


@register_aggregator("median", robust=True)
def median(uploads: Uploads, start: dict[str, Tensor], s) -> dict[str, Tensor]:
    """Each coordinate's median over the round's clients, unweighted (Yin et al. 2018); the mean of the two middle
    values when their number is even."""
    return coordinatewise(uploads, median_of_rows)
