"""Aggregation of uploads: the streamed float64 weighted sum behind the FedAvg average (fl/core/exchange.py), the
server's aggregate hook with the aggregators `server.aggregator` chooses (fl/core/aggregation.py): hand computations,
the default path unchanged, equalities between code paths, resume, 1 and 2 processes, refusals; and the checkpoint's
gather of client states on process 0."""
import pytest
import torch

from fl.config import ConfigError, load_config
from fl.core import aggregation
from fl.core.aggregation import ClientUpload, Uploads, make_aggregator
from fl.core.exchange import WeightedSum
from fl.methods.fedavg import FedAvgClient
from fl.run.train import main
from tests.helpers import (
    ROOT,
    global_params,
    interrupted_and_resumed,
    load_ckpt,
    one_and_two_processes,
    read_metrics,
    record_uploads,
    run_cli,
    run_tiny,
)


def test_weighted_sum_is_the_fedavg_average():
    acc = WeightedSum()
    acc.add({"w": torch.full((2, 2), 1.0), "n": torch.tensor(4)}, 10.0)
    acc.add({"w": torch.full((2, 2), 4.0), "n": torch.tensor(8)}, 30.0)
    acc.add({"w": torch.full((2, 2), 3.25), "n": torch.tensor(6)}, 0.0)
    assert acc.total == 40.0
    assert torch.equal(acc.sums["w"] / acc.total, torch.full((2, 2), 3.25, dtype=torch.float64))
    assert acc.sums["n"].item() == 8  # integer counters: the maximum, not an average
    assert acc.layout() == [("w", (2, 2), torch.float32), ("n", (), torch.int64)]


# ---- the aggregate hook and the aggregators (fl/core/aggregation.py) -------------------------------------------------


def kept(values: list[list[float]], weights=None, counters=None) -> Uploads:
    """Fabricated uploads: client i sends w = values[i] (float32) and a counter, with a weight the robust
    aggregators must ignore."""
    weights = weights or [float(10 ** i) for i in range(len(values))]
    counters = counters or list(range(len(values)))
    return Uploads.kept([ClientUpload(cid, {"w": torch.tensor(v), "n": torch.tensor(c)}, wt)
                         for cid, (v, wt, c) in reversed(list(enumerate(zip(values, weights, counters))))])


def test_median_by_hand_odd_and_even():
    odd = make_aggregator("median")(kept([[1.0, 5.0, -2.0], [3.0, 4.0, -2.0], [2.0, 100.0, 7.0]], counters=[3, 9, 4]))
    assert torch.equal(odd["w"], torch.tensor([2.0, 5.0, -2.0]))
    assert odd["n"].item() == 9 and odd["n"].dtype == torch.int64  # counters: the maximum, as under the mean
    even = make_aggregator("median")(kept([[1.0, 8.0], [4.0, -1.0], [2.0, 0.5], [100.0, 3.0]]))
    assert torch.equal(even["w"], torch.tensor([3.0, 1.75]))  # the mean of the two middle values: (2+4)/2, (0.5+3)/2


def test_trimmed_mean_by_hand():
    rows = [[1.0, 8.0], [4.0, -1.0], [2.0, 0.5], [100.0, 3.0], [3.0, 3.0]]
    # beta = 0.2 of 5 clients: one value dropped at each end of every coordinate
    got = make_aggregator("trimmed_mean", 0.2)(kept(rows))["w"]
    assert torch.equal(got, torch.tensor([(2.0 + 3.0 + 4.0) / 3, (0.5 + 3.0 + 3.0) / 3]))
    # beta = 0.4: two at each end, the median; beta = 0.19: floor(0.95) = 0 dropped, the unweighted mean
    assert torch.equal(make_aggregator("trimmed_mean", 0.4)(kept(rows))["w"], torch.tensor([3.0, 3.0]))
    assert torch.equal(make_aggregator("trimmed_mean", 0.19)(kept(rows))["w"],
                       torch.tensor([110.0 / 5, 13.5 / 5]))


def test_trimmed_mean_with_fraction_0_is_the_unweighted_mean_bitwise():
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(7, 50, generator=gen) * torch.logspace(-3, 3, 50)
    uniform = Uploads.kept([ClientUpload(cid, {"w": r}, 1.0) for cid, r in enumerate(rows)])
    assert torch.equal(make_aggregator("trimmed_mean", 0.0)(kept(rows.tolist()))["w"], uniform.mean()["w"])


def test_chunks_of_coordinates_give_the_same_result(monkeypatch):
    gen = torch.Generator().manual_seed(1)
    rows = (torch.randn(6, 4, 5, generator=gen)).tolist()
    whole = {name: make_aggregator(name, 0.2)(kept(rows))["w"] for name in ("median", "trimmed_mean")}
    monkeypatch.setattr(aggregation, "CHUNK_ELEMENTS", 13)  # 2 coordinates of 6 clients per chunk
    for name, value in whole.items():
        assert torch.equal(make_aggregator(name, 0.2)(kept(rows))["w"], value)


def test_streamed_uploads_are_not_kept():
    uploads = Uploads(keep_each=False)
    uploads.add(0, {"w": torch.ones(3)}, 2.0)
    assert uploads.sum.total == 2.0
    with pytest.raises(RuntimeError, match="needs_every_upload"):
        _ = uploads.clients


def test_the_default_aggregator_streams_and_is_the_float64_weighted_mean_bitwise(out, monkeypatch):
    """No server.* set: uploads are summed as they come (none kept) and the new global model is sum_i n_i x_i /
    sum_i n_i, summed in float64 in client order, as before the aggregate hook existed."""
    sent = record_uploads(monkeypatch, FedAvgClient)
    seen = []
    gathered = Uploads.gathered

    def spy(self, fabric, mean):
        seen.append((self.keep_each, len(self._clients)))
        return gathered(self, fabric, mean)

    monkeypatch.setattr(Uploads, "gathered", spy)
    got = global_params(run_tiny(out, "trainer.rounds=1", name="mean"))
    assert seen == [(False, 0)] and len(sent) == 3
    total = sum(w for *_, w in sent)
    for k, v in got.items():
        acc = torch.zeros_like(v, dtype=torch.float64)
        for _, _, params, w in sorted(sent, key=lambda s: s[1]):
            acc.add_(params[k].double(), alpha=w)
        assert torch.equal(v, (acc / total).to(v.dtype)), k


def test_a_median_round_is_the_median_of_the_uploads(out, monkeypatch):
    """Three clients a round: the global model is each coordinate's middle upload; trimming one of three at each
    end is the same model."""
    sent = record_uploads(monkeypatch, FedAvgClient)
    med = global_params(run_tiny(out, "trainer.rounds=1", "server.aggregator=median", name="median"))
    stacked = {k: torch.stack([p[k] for _, _, p, _ in sent]) for k in med}
    assert len(sent) == 3 and all(torch.equal(med[k], stacked[k].median(dim=0).values) for k in med)
    trim = global_params(run_tiny(out, "trainer.rounds=1", "server.aggregator=trimmed_mean",
                                  "server.trim_fraction=0.34", name="trim"))
    assert all(torch.equal(trim[k], med[k]) for k in med)


def test_trimmed_mean_0_equals_the_streamed_mean_under_uniform_weights(out):
    """SCAFFOLD with uniform weights and server_lr 1: its server step gets the uploads' unweighted mean, streamed
    (mean) or kept and trimmed by nothing (trimmed_mean, beta 0): the same run, bit for bit."""
    extra = ("method.name=scaffold", "method.param_weighting=uniform")
    a = run_tiny(out, *extra, name="mean")
    b = run_tiny(out, *extra, "server.aggregator=trimmed_mean", "server.trim_fraction=0", name="trim0")
    assert read_metrics(a) == read_metrics(b)
    ga, gb = global_params(a), global_params(b)
    assert ga.keys() == gb.keys() and all(torch.equal(ga[k], gb[k]) for k in ga)


def test_a_median_run_resumes_exactly(out, monkeypatch):
    full, cut = interrupted_and_resumed(out, monkeypatch, "server.aggregator=median", "trainer.rounds=4",
                                        "trainer.checkpoint_every=10")
    assert read_metrics(cut) == read_metrics(full)
    ga, gb = global_params(full), global_params(cut)
    assert all(torch.equal(ga[k], gb[k]) for k in ga)


@pytest.mark.slow
@pytest.mark.parametrize("aggregator", ["median", "trimmed_mean"])
def test_robust_aggregators_on_one_and_two_processes_give_the_same_run(out, aggregator):
    """Every process gathers every upload in client order and aggregates them alike: bitwise the same global model
    on 1 and 2 processes (7 clients, 4 a round: 3 on one process, 1 on the other in some rounds)."""
    one, two = one_and_two_processes(out, f"server.aggregator={aggregator}", "server.trim_fraction=0.25",
                                     "trainer.rounds=3", "data.num_clients=7", "trainer.participation=0.6",
                                     "model.norm=batch")
    assert read_metrics(one) == read_metrics(two)
    ga, gb = load_ckpt(one)["server"]["global_params"], load_ckpt(two)["server"]["global_params"]
    assert ga.keys() == gb.keys() and all(torch.equal(ga[k], gb[k]) for k in ga)


@pytest.mark.parametrize("method", ["confree", "fedpals", "fedacd", "fedas", "fedmosaic", "local"])
def test_methods_whose_aggregation_is_their_own_refuse_another(method):
    with pytest.raises(ConfigError, match=r"server.aggregator='median' cannot apply to method.name="):
        load_config([f"method.name={method}", "server.aggregator=median", "data.target.distribution=partition",
                     "data.public_size=50"])


def test_the_refusal_is_one_line_and_exit_2_and_other_settings_are_accepted(capsys):
    assert main(["method.name=confree", "server.aggregator=trimmed_mean"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "aggregates the uploads itself" in err
    for ok in (["method.name=fedacd", "method.aggregation=uniform"], ["method.name=fedas", "method.weighting=samples"],
               ["method.name=scaffold"], ["method.name=fedrep"]):
        assert load_config([*ok, "server.aggregator=median"]).server.aggregator == "median"
    with pytest.raises(ConfigError, match="server.trim_fraction"):
        load_config(["server.trim_fraction=0.5"])


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
    assert not zero["group_outlives_destroy"] and not one["group_outlives_destroy"]
