"""Aggregation of uploads (fl/core/exchange.py): the weighted sum behind the FedAvg average; the checkpoint's gather of
client states on process 0."""
import pytest
import torch

from fl.core.exchange import WeightedSum
from tests.helpers import ROOT, run_cli


def test_weighted_sum_is_the_fedavg_average():
    acc = WeightedSum()
    acc.add({"w": torch.full((2, 2), 1.0), "n": torch.tensor(4)}, 10.0)
    acc.add({"w": torch.full((2, 2), 4.0), "n": torch.tensor(8)}, 30.0)
    acc.add({"w": torch.full((2, 2), 3.25), "n": torch.tensor(6)}, 0.0)
    assert acc.total == 40.0
    assert torch.equal(acc.sums["w"] / acc.total, torch.full((2, 2), 3.25, dtype=torch.float64))
    assert acc.sums["n"].item() == 8  # integer counters: the maximum, not an average
    assert acc.layout() == [("w", (2, 2), torch.float32), ("n", (), torch.int64)]


@pytest.mark.slow
def test_checkpoint_states_gather_on_process_zero_only_through_host_memory(tmp_path):
    """Under NCCL (simulated: two gloo processes whose default backend reads 'nccl') the gather goes through a gloo
    group made once, and only process 0, which writes the checkpoint, receives the states."""
    res = run_cli([str(tmp_path)], cwd=tmp_path, script=(str(ROOT / "tests" / "gather_to_zero.py"),))
    assert res.returncode == 0, res.stderr[-2000:]
    zero, one = (torch.load(tmp_path / f"{rank}.pt", weights_only=False) for rank in (0, 1))
    assert [p["rank"] for p in zero["first"]] == [0, 1]
    assert all(torch.equal(p["state"], torch.full((3,), float(r))) for r, p in enumerate(zero["first"]))
    assert zero["second"] == [[0], [1, 1]]
    assert one["first"] is None and one["second"] is None
    assert all(r["own_group"] and r["same_group"] and r["group_size"] == 2 for r in (zero, one))
