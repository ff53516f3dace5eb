"""The learning rate of a round (fl/core/optim.py, `optim.round_schedule`)."""
import math

import pytest

from fl.config import load_config
from fl.core import round_lr


def test_round_cosine_schedule_matches_the_formula():
    """eta_t = min_lr + (lr - min_lr)(1 + cos(pi t / R)) / 2, stepped once per round (FedDRM's schedule)."""
    cfg = load_config(["optim.lr=0.01", "optim.round_schedule=cosine", "trainer.rounds=800"])
    assert round_lr(cfg, 0) == pytest.approx(0.01)
    assert round_lr(cfg, 400) == pytest.approx(0.005)
    assert round_lr(cfg, 100) == pytest.approx(0.005 * (1 + math.cos(math.pi / 8)))
    cfg.optim.round_schedule = "constant"
    assert round_lr(cfg, 400) == 0.01
