"""GroupedAccuracy, apart from evaluation.py so that importing an evaluator does not import torchmetrics: it
loads when an evaluation first counts (fl.core.GroupedAccuracy resolves to it on first use)."""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor
from torchmetrics import Metric


class GroupedAccuracy(Metric):
    """Correct / total per group (a client, a class, ...), as float64 counts summed across processes."""

    full_state_update = False

    def __init__(self, num_groups: int, **kwargs):
        super().__init__(**kwargs)
        self.add_state("correct", torch.zeros(num_groups, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros(num_groups, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, preds: Tensor, target: Tensor, group: Optional[int] = None) -> None:
        """All samples in one `group`, or (group=None) each sample in the group of its true class."""
        if group is None:
            K = self.total.numel()
            self.total += torch.bincount(target, minlength=K).to(self.total.dtype)
            self.correct += torch.bincount(target[preds == target], minlength=K).to(self.correct.dtype)
        else:
            self.correct[group] += (preds == target).sum()
            self.total[group] += target.numel()

    def compute(self) -> tuple[Tensor, Tensor]:
        return self.correct.clone(), self.total.clone()

    def counts(self) -> tuple[Tensor, Tensor]:
        """(correct, total) per group, summed across processes (torchmetrics squeezes a 1-element compute()
        result; these stay vectors)."""
        return tuple(t.reshape(-1) for t in self.compute())
