"""Per-client accuracy as a torchmetrics Metric, and the across-client summaries every method reports."""
from __future__ import annotations

import math

import torch
from torch import Tensor
from torchmetrics import Metric


class ClientAccuracy(Metric):
    """Correct / total per client. Each process evaluates different clients; the sum-reduce merges them."""

    full_state_update = False

    def __init__(self, num_clients: int, **kwargs):
        super().__init__(**kwargs)
        self.add_state("correct", torch.zeros(num_clients, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros(num_clients, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor, client: int) -> None:
        self.correct[client] += (preds == target).sum()
        self.total[client] += target.numel()

    def compute(self) -> tuple[Tensor, Tensor]:
        return self.correct.clone(), self.total.clone()


def summarize_clients(correct: Tensor, total: Tensor, train_sizes: list[int], prefix: str = "test/") -> dict[str, float]:
    """acc_mean_clients (unweighted), acc_weighted (by test size), acc_weighted_train (by train size,
    FedDRM's Table 2), acc_micro (pooled correct / pooled total), std across clients (unbiased) and
    the mean of the worst 10% of clients (at least one). Clients without test samples are skipped."""
    has = total > 0
    acc = correct[has] / total[has]
    test_w = total[has] / total[has].sum()
    train = torch.tensor(train_sizes, dtype=torch.float64, device=acc.device)[has]
    k = max(1, math.ceil(0.1 * len(acc)))
    out = {
        "acc_mean_clients": acc.mean(),
        "acc_weighted": (test_w * acc).sum(),
        "acc_weighted_train": (train / train.sum() * acc).sum(),
        "acc_micro": correct[has].sum() / total[has].sum(),
        "acc_std_clients": acc.std() if len(acc) > 1 else torch.zeros((), dtype=acc.dtype),
        "acc_worst10": acc.sort().values[:k].mean(),
    }
    return {prefix + k: float(v) for k, v in out.items()}
