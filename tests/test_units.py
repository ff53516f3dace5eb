"""Closed-form checks of the small pieces: batching, sampling, partitions, aggregation, summaries."""
import math

import pytest
import torch

from fl.core import batch_indices, summarize_clients
from fl.core.loop import WeightedSum, sample_clients
from fl.core.seeding import derive_seed, generator
from fl.report.summary import summarize_history


def test_batch_indices_epochs_cover_each_sample_once_per_pass():
    seen = [idx for _, idx in batch_indices(10, 4, generator(0, 0, 0, "t"), epochs=2) if idx is not None]
    assert [len(i) for i in seen] == [4, 4, 2, 4, 4, 2]
    assert sorted(torch.cat(seen[:3]).tolist()) == list(range(10))
    marks = [e for e, idx in batch_indices(10, 4, generator(0, 0, 0, "t"), epochs=2) if idx is None]
    assert marks == [0, 1]


def test_batch_indices_steps_counts_steps_across_passes():
    got = [idx for _, idx in batch_indices(10, 4, generator(0, 0, 0, "t"), steps=5) if idx is not None]
    assert len(got) == 5
    dropped = [idx for _, idx in batch_indices(10, 4, generator(0, 0, 0, "t"), epochs=1, drop_last=True)
               if idx is not None]
    assert [len(i) for i in dropped] == [4, 4]


def test_derived_seeds_depend_on_every_part():
    base = derive_seed(0, 1, 2, "train")
    assert base == derive_seed(0, 1, 2, "train")
    assert len({base, derive_seed(1, 1, 2, "train"), derive_seed(0, 2, 2, "train"),
                derive_seed(0, 1, 3, "train"), derive_seed(0, 1, 2, "eval")}) == 5


def test_client_sampling_is_a_fixed_stream():
    a = [sample_clients(3, r, 100, 0.1) for r in range(5)]
    assert a == [sample_clients(3, r, 100, 0.1) for r in range(5)]
    assert all(len(s) == 10 and s == sorted(set(s)) for s in a)
    assert a[0] != a[1]
    assert sample_clients(0, 0, 7, 1.0) == list(range(7))
    assert len(sample_clients(0, 0, 7, 0.01)) == 1


def test_weighted_sum_is_the_fedavg_average():
    acc = WeightedSum()
    acc.add({"w": torch.full((2, 2), 1.0), "n": torch.tensor(4)}, 10.0)
    acc.add({"w": torch.full((2, 2), 4.0), "n": torch.tensor(8)}, 30.0)
    acc.add({"w": torch.full((2, 2), 3.25), "n": torch.tensor(6)}, 0.0)
    assert acc.total == 40.0
    assert torch.equal(acc.sums["w"] / acc.total, torch.full((2, 2), 3.25, dtype=torch.float64))
    assert acc.sums["n"].item() == 8  # integer counters: the maximum, not an average
    assert acc.layout() == [("w", (2, 2), torch.float32), ("n", (), torch.int64)]


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


def test_round_cosine_schedule_matches_the_formula():
    """eta_t = min_lr + (lr - min_lr)(1 + cos(pi t / R)) / 2, stepped once per round (FedDRM's schedule)."""
    from fl.config import load_config
    from fl.core import round_lr

    cfg = load_config(["optim.lr=0.01", "optim.round_schedule=cosine", "trainer.rounds=800"])
    assert round_lr(cfg, 0) == pytest.approx(0.01)
    assert round_lr(cfg, 400) == pytest.approx(0.005)
    assert round_lr(cfg, 100) == pytest.approx(0.005 * (1 + math.cos(math.pi / 8)))
    cfg.optim.round_schedule = "constant"
    assert round_lr(cfg, 400) == 0.01


def test_augmentations_are_seeded_and_keep_shapes():
    from fl.core import augment
    from fl.core.seeding import generator

    x = torch.randint(0, 256, (8, 3, 16, 16), dtype=torch.uint8)
    names = ["flip", "crop", "resized_crop", "rotate"]
    a = augment(x, names, generator(0, 1, 2, "train/augment"))
    b = augment(x, names, generator(0, 1, 2, "train/augment"))
    c = augment(x, names, generator(0, 1, 3, "train/augment"))
    assert a.shape == x.shape and a.dtype == x.dtype
    assert torch.equal(a, b) and not torch.equal(a, c)
    flipped = augment(x, ["flip"], generator(0, 0, 0, "f"))  # each image is itself or its mirror
    assert all(torch.equal(f, i) or torch.equal(f, i.flip(-1)) for f, i in zip(flipped, x))
    with pytest.raises(ValueError, match="image batches"):
        augment(torch.zeros(4, 10), ["flip"], generator(0, 0, 0, "f"))
