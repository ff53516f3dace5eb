"""The coordinate-wise trimmed mean (Yin et al. 2018, "Byzantine-Robust Distributed Learning: Towards Optimal
Statistical Rates", Definition 2)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor

from fl.config import param
from fl.core.aggregation import Uploads, coordinatewise, trimmed_mean_of_rows
from fl.core.registry import register_aggregator


@dataclass
class Settings:
    trim_fraction: float = param(0.1, ge=0.0, lt=0.5, help="beta: each coordinate drops its floor(beta N) largest and "
                                 "floor(beta N) smallest values of the N clients (0 = the unweighted mean); "
                                 "refused where it trims nothing, e.g. 0.1 below 10 clients a round")


def check(s, clients: int):
    """A trim fraction that trims nothing at this many clients a round is the plain mean under a robust rule's
    name: refused (0, asked for explicitly, is the unweighted mean and stays allowed)."""
    beta = float(s.trim_fraction)
    trimmed = math.floor(beta * clients)
    if beta > 0 and trimmed == 0:
        return (f"server.aggregator.trim_fraction={beta:g} trims floor({beta:g} x {clients}) = 0 values per "
                f"coordinate at the {clients} clients this config trains a round, so the rule would be the plain "
                f"mean: raise it to at least {math.ceil(1000 / clients) / 1000:g} (< 0.5), or set 0 for the "
                "unweighted mean")
    return None


@register_aggregator("trimmed_mean", Settings, check=check, robust=True)
def trimmed_mean(uploads: Uploads, start: dict[str, Tensor], s) -> dict[str, Tensor]:
    """Each coordinate's beta-trimmed mean over the round's clients, unweighted (Yin et al. 2018): the floor(beta N)
    largest and smallest values dropped, the rest averaged."""
    beta = float(s.trim_fraction)
    return coordinatewise(uploads, lambda rows: trimmed_mean_of_rows(rows, math.floor(beta * len(rows))))
