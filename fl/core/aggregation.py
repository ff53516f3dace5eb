"""A round's parameter uploads as the server's `aggregate` hook sees them, and the aggregators `server.aggregator`
chooses from: the weighted mean (the default), the coordinate-wise median and the coordinate-wise trimmed mean.

The weighted mean streams: each client's parameters are added to a float64 weighted sum as it finishes
(fl/core/exchange.py WeightedSum, all-reduced across processes), so memory does not grow with the round's clients.
An aggregator that needs every upload (`needs_every_upload`) gets them kept instead, on the CPU, gathered from every
process in client order; that costs one model per client of the round on every process.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch
from torch import Tensor

from fl.core.exchange import WeightedSum, gather_objects

if TYPE_CHECKING:  # Lightning loads with the run, not with a method or an evaluator
    from lightning.fabric import Fabric

# coordinates per chunk times clients: bounds the memory of sorting the uploads of one tensor (float64 + ranks)
CHUNK_ELEMENTS = 1 << 24


@dataclass
class ClientUpload:
    """One client's uploaded parameters (on the CPU) with its aggregation weight (`Server.weight`)."""
    cid: int
    params: dict[str, Tensor]
    weight: float


class Uploads:
    """The round's parameter uploads: `mean()` is their float64 weighted mean (weights `Server.weight`); with
    `keep_each`, `clients` lists every upload, in client order, on every process."""

    def __init__(self, keep_each: bool):
        self.keep_each = keep_each
        self.sum = WeightedSum()  # stays empty when every upload is kept
        self.device: Optional[torch.device] = None
        self._clients: list[ClientUpload] = []
        self._mean: Optional[dict[str, Tensor]] = None

    @classmethod
    def kept(cls, clients: list[ClientUpload], device: str | torch.device = "cpu") -> Uploads:
        """Uploads already in one place, in client order (a unit test's fabricated ones)."""
        uploads = cls(keep_each=True)
        uploads._clients, uploads.device = sorted(clients, key=lambda u: u.cid), torch.device(device)
        return uploads

    def add(self, cid: int, params: dict[str, Tensor], weight: float) -> None:
        if self.keep_each:
            # a copy: on the CPU, params are the module's own tensors, which the next client overwrites
            self._clients.append(ClientUpload(cid, {k: v.detach().to("cpu", copy=True) for k, v in params.items()},
                                              weight))
        else:
            self.sum.add(params, weight)

    def gathered(self, fabric: Fabric, mean: dict[str, Tensor]) -> Uploads:
        """After the exchange (which all-reduced `sum` into `mean`): every process's kept uploads, in client order."""
        self.device = fabric.device
        if self.keep_each:
            self._clients = sorted((u for part in gather_objects(fabric, self._clients) for u in part),
                                   key=lambda u: u.cid)
        else:
            self._mean = mean
        return self

    @property
    def clients(self) -> list[ClientUpload]:
        if not self.keep_each:
            raise RuntimeError("the uploads were summed as they came (the weighted mean streams); a server that "
                               "needs each one sets needs_every_upload = True")
        return self._clients

    def mean(self) -> dict[str, Tensor]:
        """The weighted mean, float64-summed; integer tensors (counters) take their maximum. When every upload was
        kept it is summed here in client order, on the device, as one process sums its clients."""
        if self._mean is None:
            acc = WeightedSum()
            for u in self._clients:
                acc.add({k: v.to(self.device) for k, v in u.params.items()}, u.weight)
            self._mean = weighted_mean(acc)
        return self._mean


def weighted_mean(acc: WeightedSum) -> dict[str, Tensor]:
    """sum_i w_i x_i / sum_i w_i of a local WeightedSum, as exchange() finishes the all-reduced one."""
    if acc.total <= 0:
        return {}
    return {k: (s / acc.total if acc.dtypes[k].is_floating_point else s).to(acc.dtypes[k]) for k, s in acc.sums.items()}


# ---- aggregators ---------------------------------------------------------------------------------------------------
class Aggregator:
    """Turns the round's uploads into the server's new shared parameters (what `server_step` receives)."""
    needs_every_upload = True

    def __call__(self, uploads: Uploads) -> dict[str, Tensor]:
        raise NotImplementedError


class WeightedMean(Aggregator):
    """sum_i w_i x_i / sum_i w_i, streamed (FedAvg with w_i = n_i)."""
    needs_every_upload = False

    def __call__(self, uploads: Uploads) -> dict[str, Tensor]:
        return uploads.mean()


class CoordinateMedian(Aggregator):
    """Each coordinate's median over the round's clients, unweighted (Yin et al. 2018, Definition 1); with an even
    number of clients the mean of the two middle values."""

    def __call__(self, uploads: Uploads) -> dict[str, Tensor]:
        return coordinatewise(uploads, median_of_rows)


class TrimmedMean(Aggregator):
    """Each coordinate's beta-trimmed mean, unweighted (Yin et al. 2018, Definition 2): the floor(beta N) largest
    and floor(beta N) smallest of the N clients' values are dropped, the rest averaged."""

    def __init__(self, fraction: float):
        self.fraction = fraction

    def __call__(self, uploads: Uploads) -> dict[str, Tensor]:
        return coordinatewise(uploads, lambda rows: trimmed_mean_of_rows(rows, math.floor(self.fraction * len(rows))))


def make_aggregator(name: str, trim_fraction: float = 0.0) -> Aggregator:
    """The aggregator `server.aggregator` names."""
    if name == "mean":
        return WeightedMean()
    if name == "median":
        return CoordinateMedian()
    if name == "trimmed_mean":
        return TrimmedMean(trim_fraction)
    raise ValueError(f"server.aggregator={name!r}: choices are mean, median, trimmed_mean")


def coordinatewise(uploads: Uploads, rule) -> dict[str, Tensor]:
    """`rule` ([clients, coordinates] float64 -> [coordinates] float64) applied to every floating tensor, over the
    clients that uploaded it, in chunks of coordinates; integer tensors (counters) take their maximum, as in the
    mean. The result is on the run's device, in each tensor's dtype."""
    clients = uploads.clients
    keys = list(dict.fromkeys(k for u in clients for k in u.params))
    device = uploads.device or torch.device("cpu")
    out = {}
    for k in keys:
        values = [u.params[k] for u in clients if k in u.params]
        like = values[0]
        if not like.is_floating_point():
            out[k] = torch.stack(values).to(device).amax(dim=0)
            continue
        flat = [v.reshape(-1) for v in values]
        step = max(1, CHUNK_ELEMENTS // len(flat))
        parts = [rule(torch.stack([v[i:i + step] for v in flat]).to(device, torch.float64))
                 for i in range(0, like.numel(), step)]
        out[k] = torch.cat(parts).view(like.shape).to(like.dtype)
    return out


def median_of_rows(rows: Tensor) -> Tensor:
    ordered = rows.sort(dim=0).values
    n = rows.shape[0]
    return (ordered[(n - 1) // 2] + ordered[n // 2]) / 2


def trimmed_mean_of_rows(rows: Tensor, trim: int) -> Tensor:
    """The mean of each column without its `trim` smallest and `trim` largest values (ties broken by client order).
    The kept values are summed in client order, so trim = 0 is the unweighted mean exactly as the streaming sum
    computes it."""
    n = rows.shape[0]
    order = rows.argsort(dim=0, stable=True)
    rank = torch.empty_like(order).scatter_(0, order, torch.arange(n, device=rows.device).unsqueeze(1).expand_as(order))
    keep = (rank >= trim) & (rank < n - trim)
    acc = torch.zeros_like(rows[0])
    for row, kept in zip(rows, keep):
        acc.add_(torch.where(kept, row, 0.0))
    return acc / float(n - 2 * trim)
