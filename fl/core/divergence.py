"""Divergence that stays finite: a training loss or a model that grows by orders of magnitude while every number
is still a float, so the non-finite guard never fires (pFedFDA with its paper's small covariance regularisation
on a few shifted samples per client: losses of 1e5 to 1e36, every head collapsed, exit 0).

The rule: a client's round diverged when its mean training loss exceeds GROWTH x max(1, the mean training loss of
the run's first trained round), or the norm of its uploaded parameters exceeds GROWTH x the norm of the same
parameters in the initial model. The floor of 1 keeps a loss that starts near 0 from counting growth to 0.5 as
divergence. Healthy runs stay far below both limits (docs/reproducibility.md, "Divergence": the largest ratios
measured over the shipped configs' synthetic twins)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional

import torch

GROWTH = 1e3  # three orders of magnitude


@dataclass(frozen=True)
class Divergence:
    """Where a run diverged first; summary.json's `diverged` entry (round, client, method, reason)."""
    round: int
    client: Optional[int]  # None: the server's step (its aggregate), not a client
    method: str
    reason: str

    def as_dict(self) -> dict:
        return asdict(self)


def parameter_norm(params: dict[str, torch.Tensor]) -> float:
    """The L2 norm of the floating-point tensors, in float64 (no overflow for any finite float32): non-finite
    exactly when some entry is. One host sync per call: once per client and round."""
    floats = [p for p in params.values() if p.is_floating_point()]
    if not floats:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p, dtype=torch.float64)
                                                       for p in floats])))


def squared_norms(params: dict[str, torch.Tensor]) -> dict[str, float]:
    """Each floating-point tensor's squared L2 norm (float64), in one host sync: the initial model's reference."""
    floats = {k: p for k, p in params.items() if p.is_floating_point()}
    if not floats:
        return {}
    values = torch.stack([torch.linalg.vector_norm(p, dtype=torch.float64).cpu() ** 2 for p in floats.values()])
    return dict(zip(floats, values.tolist()))


def reference_loss(history: list[dict]) -> Optional[float]:
    """The mean training loss of the first round that trained (None before it)."""
    for row in history:
        loss = row.get("train/loss")
        if loss is not None and math.isfinite(loss):
            return float(loss)
    return None


def initial_norm(initial: dict[str, float], names) -> float:
    """The norm of the named tensors in the initial model, from its squared norms (`squared_norms`)."""
    return math.sqrt(sum(initial.get(k, 0.0) for k in names))


def find_divergence(rnd: int, method: str, clients: list[tuple[int, dict, Optional[tuple[float, float]]]],
                    first_loss: Optional[float]) -> Optional[Divergence]:
    """The first client (in client order) of round `rnd` that diverged by the rule above, or None. `clients`:
    (client id, its logs, (the norm of its upload, the initial model's norm of the same tensors) or None) each."""
    loss_limit = None if first_loss is None else GROWTH * max(1.0, first_loss)
    for cid, logs, norms in clients:
        loss = logs.get("loss")
        if loss_limit is not None and loss is not None and loss > loss_limit:
            return Divergence(rnd, cid, method, f"training loss {loss:.3g} > {GROWTH:g} x max(1, {first_loss:.3g}), "
                                                f"the first trained round's mean")
        if norms is not None and norms[1] > 0 and norms[0] > GROWTH * norms[1]:
            return Divergence(rnd, cid, method, f"parameter norm {norms[0]:.3g} > {GROWTH:g} x {norms[1]:.3g}, the "
                                                f"initial model's")
    return None
