"""A round's parameter uploads as the server's `aggregate` hook sees them, and what the aggregators
`server.aggregator.name` chooses from (fl/aggregators/, one file each) compute with: coordinate-wise rules over the
clients' values of each coordinate, distances between whole uploads, and linear combinations of them.

The weighted mean streams: each client's parameters are added to a float64 weighted sum as it finishes
(fl/core/exchange.py WeightedSum, all-reduced across processes), so memory does not grow with the round's clients.
An aggregator that needs every upload (`needs_every_upload`) gets them kept instead, on the CPU, gathered from every
process in client order; that costs one model per client of the round on every process.
"""
from __future__ import annotations

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

    def leave_out(self, cids: set[int]) -> None:
        """Drop these clients' kept uploads (faulty ones a robust aggregator does without)."""
        self._clients = [u for u in self._clients if u.cid not in cids]

    @property
    def clients(self) -> list[ClientUpload]:
        if not self.keep_each:
            raise RuntimeError("the uploads were summed as they came (the weighted mean streams); a server that "
                               "needs each one sets needs_every_upload = True")
        return self._clients

    def reference(self) -> dict[str, Tensor]:
        """What the clients uploaded, for its keys, shapes and dtypes: one upload, or the streamed mean ({}: the round
        had no uploads)."""
        if self.keep_each:
            return self._clients[0].params if self._clients else {}
        return self._mean or {}

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


# ---- what the aggregators (fl/aggregators/) compute with -------------------------------------------------------------
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


# ---- whole uploads as vectors (Krum, the geometric median, norm clipping) --------------------------------------------
def floating_keys(uploads: Uploads) -> list[str]:
    """The floating tensors' keys, which every upload of the round must carry alike (a rule on whole vectors
    compares them coordinate by coordinate)."""
    clients = uploads.clients
    keys = [k for k, v in clients[0].params.items() if v.is_floating_point()]
    for u in clients[1:]:
        mine = [k for k, v in u.params.items() if v.is_floating_point()]
        if sorted(mine) != sorted(keys):
            raise ValueError(f"client {u.cid} uploaded other floating tensors than client {clients[0].cid} "
                             f"({sorted(set(mine) ^ set(keys))[:3]}); this aggregator compares whole uploads")
    return keys


def coordinate_blocks(uploads: Uploads, keys: list[str]):
    """(key, start, [clients, coordinates] float64 on the run's device) over the floating coordinates of every
    upload, in chunks (CHUNK_ELEMENTS bounds the memory of one block)."""
    clients, device = uploads.clients, uploads.device or torch.device("cpu")
    step = max(1, CHUNK_ELEMENTS // len(clients))
    for k in keys:
        flat = [u.params[k].reshape(-1) for u in clients]
        for i in range(0, flat[0].numel(), step):
            yield k, i, torch.stack([v[i:i + step] for v in flat]).to(device, torch.float64)


def pairwise_sq_distances(uploads: Uploads) -> Tensor:
    """[n, n] float64: ||x_i - x_j||^2 over every floating coordinate, exactly symmetric."""
    keys, n = floating_keys(uploads), len(uploads.clients)
    out = torch.zeros(n, n, dtype=torch.float64, device=uploads.device)
    for _, _, rows in coordinate_blocks(uploads, keys):
        for i in range(n):
            out[i] += (rows - rows[i]).pow(2).sum(dim=1)
    return out


def distances_to(uploads: Uploads, point: dict[str, Tensor]) -> Tensor:
    """[n] float64: ||x_i - point|| over every floating coordinate of the uploads."""
    keys = floating_keys(uploads)
    missing = [k for k in keys if k not in point]
    if missing:
        raise ValueError(f"{missing[0]!r} is uploaded but not in the point the uploads are measured from")
    out = torch.zeros(len(uploads.clients), dtype=torch.float64, device=uploads.device)
    for k, i, rows in coordinate_blocks(uploads, keys):
        ref = point[k].reshape(-1)[i:i + rows.shape[1]].to(rows.device, torch.float64)
        out += (rows - ref).pow(2).sum(dim=1)
    return out.sqrt()


def combination(uploads: Uploads, coefficients: Tensor, origin: Optional[dict[str, Tensor]] = None
                ) -> dict[str, Tensor]:
    """origin + sum_i c_i (x_i - origin) for every floating tensor (origin None: sum_i c_i x_i), summed in float64
    in client order over the clients with c_i != 0; float64 on the run's device. Integer tensors (counters) take
    their maximum, as under the mean, in their dtype."""
    clients, device = uploads.clients, uploads.device or torch.device("cpu")
    coefficients = coefficients.tolist()
    out = {}
    for k in dict.fromkeys(k for u in clients for k in u.params):
        values = [(c, u.params[k]) for c, u in zip(coefficients, clients) if k in u.params]
        if not values[0][1].is_floating_point():
            out[k] = torch.stack([v for _, v in values]).to(device).amax(dim=0)
            continue
        base = None if origin is None else origin[k].to(device, torch.float64)
        acc = torch.zeros_like(values[0][1], dtype=torch.float64, device=device) if base is None else base.clone()
        for c, v in values:
            if c != 0.0:
                acc.add_(v.to(device, torch.float64) - (0.0 if base is None else base), alpha=c)
        out[k] = acc
    return out


def in_upload_dtypes(uploads: Uploads, params: dict[str, Tensor]) -> dict[str, Tensor]:
    """`params` (float64 sums) cast to the dtype each tensor was uploaded in."""
    like = {k: v for u in reversed(uploads.clients) for k, v in u.params.items()}
    return {k: v.to(like[k].dtype) for k, v in params.items()}
