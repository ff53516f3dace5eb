"""The configured optimizer and the learning rate of a round (`optim.*`)."""
from __future__ import annotations

import math
from typing import Optional

import torch
from omegaconf import DictConfig


def is_finetune_round(cfg: DictConfig, round_idx: int) -> bool:
    """Whether the round is one of the local fine-tuning rounds that end the run (`finetune.after_round`)."""
    after = cfg.finetune.after_round
    return after is not None and round_idx >= after


def finetune_lr(cfg: DictConfig, round_idx: int) -> float:
    """The fine-tuning rate of a round: `finetune.lr` (constant, or cosine to 0 over the fine-tuning rounds),
    or, when it is null, the rate the run's own schedule gives the round."""
    f = cfg.finetune
    if f.lr is None:
        return round_lr(cfg, round_idx)
    if f.schedule == "constant" or f.after_round is None:
        return float(f.lr)
    progress = (round_idx - f.after_round) / (cfg.trainer.rounds - f.after_round)
    return float(f.lr * 0.5 * (1.0 + math.cos(math.pi * progress)))


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
