"""Summaries in closed form: per-client accuracies of a round (fl/core/evaluation.py) and a run's history
(fl/report/summary.py)."""
import pytest
import torch

from fl.core import summarize_clients
from fl.report.summary import summarize_history


def test_client_summaries_closed_form():
    correct = torch.tensor([9.0, 1.0, 0.0, 5.0], dtype=torch.float64)
    total = torch.tensor([10.0, 10.0, 0.0, 20.0], dtype=torch.float64)  # client 2 has no test data
    s = summarize_clients(correct, total, train_sizes=[100, 300, 50, 100])
    accs = torch.tensor([0.9, 0.1, 0.25], dtype=torch.float64)
    assert s["test/acc_mean_clients"] == pytest.approx(float(accs.mean()))
    assert s["test/acc_weighted"] == pytest.approx((9 + 1 + 5) / 40)
    assert s["test/acc_micro"] == pytest.approx((9 + 1 + 5) / 40)
    assert s["test/acc_weighted_train"] == pytest.approx((100 * 0.9 + 300 * 0.1 + 100 * 0.25) / 500)
    assert s["test/acc_std_clients"] == pytest.approx(float(accs.std()))
    assert s["test/acc_worst10"] == pytest.approx(0.1)


def test_history_summary_final_best_last_k():
    hist = [{"round": r, "test/acc": a, "train/loss": loss, "client/0/acc": 0.0}
            for r, a, loss in [(0, 0.2, 2.0), (1, 0.6, 1.0), (2, 0.5, 1.5)]]
    s = summarize_history(hist, last_k=2)
    assert s["final"] == {"test/acc": 0.5, "train/loss": 1.5}
    assert s["best"] == {"test/acc": 0.6, "train/loss": 1.0} and s["best_round"]["test/acc"] == 1
    assert s["mean_last_2"]["test/acc"] == pytest.approx(0.55)
