"""Which rounds the loop evaluates (`trainer.eval_every`, and always the last) and which of them the summary's
mean over the last K evaluations (`trainer.last_k`) covers."""
from __future__ import annotations

from omegaconf import DictConfig


def is_eval_round(cfg: DictConfig, rnd: int) -> bool:
    """Whether round `rnd` (0-based) ends with an evaluation."""
    t = cfg.trainer
    return (rnd + 1) % t.eval_every == 0 or rnd == t.rounds - 1


def last_k_rounds(cfg: DictConfig) -> list[int]:
    """The rounds of the evaluations the summary's last-K mean averages, for a run that trains every round."""
    rounds = [r for r in range(int(cfg.trainer.rounds)) if is_eval_round(cfg, r)]
    return rounds[-int(cfg.trainer.last_k):]
