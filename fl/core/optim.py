"""The configured optimizer and the learning rate of a round (`optim.*`)."""
from __future__ import annotations

import math
from typing import Optional

import torch
from omegaconf import DictConfig


def round_lr(cfg: DictConfig, round_idx: int) -> float:
    """The learning rate of a round under `optim.round_schedule` (stepped once per round, not per step)."""
    o = cfg.optim
    if o.round_schedule == "constant" or round_idx < 0:
        return float(o.lr)
    progress = round_idx / max(cfg.trainer.rounds, 1)
    return float(o.min_lr + (o.lr - o.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def build_optimizer(cfg: DictConfig, params, lr: Optional[float] = None) -> torch.optim.Optimizer:
    """The configured optimizer over the trainable `params`; `lr` overrides optim.lr (round schedules)."""
    o = cfg.optim
    lr = float(o.lr) if lr is None else lr
    params = [p for p in params if p.requires_grad]
    if o.name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=o.momentum, weight_decay=o.weight_decay)
    if o.name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=o.weight_decay)
    return torch.optim.AdamW(params, lr=lr, weight_decay=o.weight_decay)
