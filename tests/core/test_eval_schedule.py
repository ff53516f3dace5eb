"""Which rounds evaluate (fl/core/eval_schedule.py): every trainer.eval_every-th and the last, or with
trainer.eval_last_k_only only those the summary's last-K mean reads; skipping the others changes no number."""
import pytest

from fl.config import load_config
from fl.core.eval_schedule import is_eval_round, last_k_rounds
from fl.report.summary import summarize_history
from fl.testing import same_state
from tests.helpers import load_ckpt, read_metrics, run_tiny


@pytest.mark.parametrize("rounds, every, last_k, evaluated, window", [
    (11, 2, 3, [2, 4, 6, 8, 10, 11], [8, 10, 11]),
    (40, 4, 5, [4, 8, 12, 16, 20, 24, 28, 32, 36, 40], [24, 28, 32, 36, 40]),
    (4, 4, 5, [4], [4]),  # fewer evaluations than K: the summary averages those there are
    (80, 4, 5, list(range(4, 81, 4)), [64, 68, 72, 76, 80]),  # the reproductions' doubled twin
])
def test_the_rounds_that_evaluate(rounds, every, last_k, evaluated, window):
    args = [f"trainer.rounds={rounds}", f"trainer.eval_every={every}", f"trainer.last_k={last_k}"]
    for only, want in ((False, evaluated), (True, window)):
        cfg = load_config([*args, f"trainer.eval_last_k_only={only}"])
        assert [r + 1 for r in range(rounds) if is_eval_round(cfg, r)] == want
        assert [r + 1 for r in last_k_rounds(cfg)] == window


def test_skipping_the_early_evaluations_changes_no_number_of_the_run(out):
    """Ditto: personal models, so every default evaluator runs (the system vote, adaptability on local models)."""
    args = ("method.name=ditto", "trainer.rounds=4", "trainer.last_k=2")
    every = run_tiny(out, *args, name="every")
    only = run_tiny(out, *args, "trainer.eval_last_k_only=true", name="only")
    rows, kept = read_metrics(every), read_metrics(only)
    assert [r["round"] for r in kept] == [0, 1, 2, 3]
    assert kept[2:] == rows[2:]
    for a, b in zip(rows[:2], kept[:2]):  # the skipped rounds still log their training
        assert not any(k.startswith(("test/", "val/")) for k in b) and b == {k: a[k] for k in b}
    assert summarize_history(kept, last_k=2)["mean_last_2"] == summarize_history(rows, last_k=2)["mean_last_2"]
    assert same_state(load_ckpt(every)["server"], load_ckpt(only)["server"]) == []
    assert same_state(load_ckpt(every)["clients"], load_ckpt(only)["clients"]) == []
