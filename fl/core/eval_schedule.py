"""Which rounds the loop evaluates (`trainer.eval_every`, and always the last; with `trainer.eval_last_k_only` only
those the summary reads) and which of them the summary's mean over the last K evaluations (`trainer.last_k`)
covers."""
from __future__ import annotations

from omegaconf import DictConfig


def _scheduled(cfg: DictConfig, rnd: int) -> bool:
    t = cfg.trainer
    return (rnd + 1) % t.eval_every == 0 or rnd == t.rounds - 1


def is_eval_round(cfg: DictConfig, rnd: int) -> bool:
    """Whether round `rnd` (0-based) ends with an evaluation."""
    if not _scheduled(cfg, rnd):
        return False
    return not cfg.trainer.eval_last_k_only or rnd >= last_k_rounds(cfg)[0]


def last_k_rounds(cfg: DictConfig) -> list[int]:
    """The rounds of the evaluations the summary's last-K mean averages, for a run that trains every round (the
    same with trainer.eval_last_k_only: it skips only the evaluations before them)."""
    found: list[int] = []
    for rnd in range(int(cfg.trainer.rounds) - 1, -1, -1):
        if len(found) == int(cfg.trainer.last_k):
            break
        if _scheduled(cfg, rnd):
            found.append(rnd)
    return found[::-1]
