"""Aggregation of uploads (fl/core/exchange.py): the weighted sum behind the FedAvg average."""
import torch

from fl.core.exchange import WeightedSum


def test_weighted_sum_is_the_fedavg_average():
    acc = WeightedSum()
    acc.add({"w": torch.full((2, 2), 1.0), "n": torch.tensor(4)}, 10.0)
    acc.add({"w": torch.full((2, 2), 4.0), "n": torch.tensor(8)}, 30.0)
    acc.add({"w": torch.full((2, 2), 3.25), "n": torch.tensor(6)}, 0.0)
    assert acc.total == 40.0
    assert torch.equal(acc.sums["w"] / acc.total, torch.full((2, 2), 3.25, dtype=torch.float64))
    assert acc.sums["n"].item() == 8  # integer counters: the maximum, not an average
    assert acc.layout() == [("w", (2, 2), torch.float32), ("n", (), torch.int64)]
