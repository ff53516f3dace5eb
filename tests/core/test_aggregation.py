"""Aggregation of uploads: the streamed float64 weighted sum behind the FedAvg average (fl/core/exchange.py), the
server's aggregate hook with the aggregators `server.aggregator.name` chooses (fl/aggregators/, computing with
fl/core/aggregation.py): hand computations and closed forms, the default path unchanged, equalities between code
paths, resume, refusals; and the checkpoint's gather of client states on process 0. Every aggregator's resume and 1 vs
2 processes (bit for bit): tests/core/test_conformance.py."""
import math

import pytest
import torch

from fl.config import ConfigError, load_config
from fl.core import aggregation, registry
from fl.core.aggregation import ClientUpload, Uploads
from fl.core.exchange import WeightedSum
from fl.methods.fedavg import FedAvgClient
from fl.run.train import main
from tests.helpers import (
    ROOT,
    global_params,
    interrupted_and_resumed,
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


def aggregate(name: str, uploads: Uploads, start=None, **settings) -> dict[str, torch.Tensor]:
    """The registered aggregator `name` with its settings' defaults, overridden by `settings`, from `start` (the
    global model; zeros when not given)."""
    registry.load_plugins()
    plugin = registry.AGGREGATORS[name]
    start = start if start is not None else {k: torch.zeros_like(v) for k, v in uploads.clients[0].params.items()}
    return plugin.fn(uploads, start, plugin.settings(**settings))


def kept(values: list[list[float]], weights=None, counters=None) -> Uploads:
    """Fabricated uploads: client i sends w = values[i] (float32) and a counter, with a weight the robust
    aggregators must ignore."""
    weights = weights or [float(10 ** i) for i in range(len(values))]
    counters = counters or list(range(len(values)))
    return Uploads.kept([ClientUpload(cid, {"w": torch.tensor(v), "n": torch.tensor(c)}, wt)
                         for cid, (v, wt, c) in reversed(list(enumerate(zip(values, weights, counters))))])


def test_median_by_hand_odd_and_even():
    odd = aggregate("median", kept([[1.0, 5.0, -2.0], [3.0, 4.0, -2.0], [2.0, 100.0, 7.0]], counters=[3, 9, 4]))
    assert torch.equal(odd["w"], torch.tensor([2.0, 5.0, -2.0]))
    assert odd["n"].item() == 9 and odd["n"].dtype == torch.int64  # counters: the maximum, as under the mean
    even = aggregate("median", kept([[1.0, 8.0], [4.0, -1.0], [2.0, 0.5], [100.0, 3.0]]))
    assert torch.equal(even["w"], torch.tensor([3.0, 1.75]))  # the mean of the two middle values: (2+4)/2, (0.5+3)/2


def test_trimmed_mean_by_hand():
    rows = [[1.0, 8.0], [4.0, -1.0], [2.0, 0.5], [100.0, 3.0], [3.0, 3.0]]
    # beta = 0.2 of 5 clients: one value dropped at each end of every coordinate
    got = aggregate("trimmed_mean", kept(rows), trim_fraction=0.2)["w"]
    assert torch.equal(got, torch.tensor([(2.0 + 3.0 + 4.0) / 3, (0.5 + 3.0 + 3.0) / 3]))
    # beta = 0.4: two at each end, the median; beta = 0.19: floor(0.95) = 0 dropped, the unweighted mean
    assert torch.equal(aggregate("trimmed_mean", kept(rows), trim_fraction=0.4)["w"], torch.tensor([3.0, 3.0]))
    assert torch.equal(aggregate("trimmed_mean", kept(rows), trim_fraction=0.19)["w"],
                       torch.tensor([110.0 / 5, 13.5 / 5]))


def test_trimmed_mean_with_fraction_0_is_the_unweighted_mean_bitwise():
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(7, 50, generator=gen) * torch.logspace(-3, 3, 50)
    uniform = Uploads.kept([ClientUpload(cid, {"w": r}, 1.0) for cid, r in enumerate(rows)])
    assert torch.equal(aggregate("trimmed_mean", kept(rows.tolist()), trim_fraction=0.0)["w"], uniform.mean()["w"])


ROBUST_SETTINGS = {"trimmed_mean": ("server.aggregator.trim_fraction=0.25",), "krum": ("server.aggregator.f=0",
                                                                                    "server.aggregator.m=2"),
                   "norm_clip": ("server.aggregator.max_norm=0.5",)}
# Krum's hand case: 5 clients, f = 1, so each upload is scored by its n - f - 2 = 2 nearest others. Squared distances:
# a-b 1, a-c 4, a-d 18, a-e 200, b-c 5, b-d 13, b-e 181, c-d 10, c-e 244, d-e 218; scores a 1+4 = 5, b 1+5 = 6,
# c 4+5 = 9, d 10+13 = 23, e 181+200 = 381.
KRUM_POINTS = [[1.0, 1.0], [2.0, 1.0], [1.0, 3.0], [4.0, 4.0], [11.0, -9.0]]


def test_krum_picks_the_upload_closest_to_its_neighbours_by_hand():
    assert torch.equal(aggregation.pairwise_sq_distances(kept(KRUM_POINTS))[0],
                       torch.tensor([0.0, 1.0, 4.0, 18.0, 200.0], dtype=torch.float64))
    from fl.aggregators.krum import krum_scores

    scores = krum_scores(aggregation.pairwise_sq_distances(kept(KRUM_POINTS)), f=1)
    assert scores.tolist() == [5.0, 6.0, 9.0, 23.0, 381.0]
    got = aggregate("krum", kept(KRUM_POINTS, counters=[3, 9, 4, 1, 0]), f=1)
    assert torch.equal(got["w"], torch.tensor([1.0, 1.0])) and got["w"].dtype == torch.float32  # a's own upload
    assert got["n"].item() == 9  # counters: the maximum, as under every aggregator
    # multi-Krum: the unweighted mean of the m best-scored (the weights 1, 10, ..., 10^4 play no part)
    assert torch.equal(aggregate("krum", kept(KRUM_POINTS), f=1, m=2)["w"], torch.tensor([1.5, 1.0]))
    assert torch.equal(aggregate("krum", kept(KRUM_POINTS), f=1, m=3)["w"], torch.tensor([4 / 3, 5 / 3]))


def test_multi_krum_of_every_upload_is_the_unweighted_mean():
    gen = torch.Generator().manual_seed(2)
    rows = torch.randn(6, 30, generator=gen)
    uniform = Uploads.kept([ClientUpload(cid, {"w": r}, 1.0) for cid, r in enumerate(rows)])
    torch.testing.assert_close(aggregate("krum", kept(rows.tolist()), f=0, m=6)["w"], uniform.mean()["w"],
                               rtol=0, atol=1e-7)


def test_krum_needs_more_than_2f_plus_2_clients_a_round():
    """6 clients at participation 0.5 train 3 a round: f = 1 needs 5; under bernoulli sampling the number is not
    fixed, and a round with too few counts at least the nearest neighbour."""
    with pytest.raises(ConfigError, match=r"^server.aggregator.f=1 needs more than 2f\+2 = 4 clients a round .* "
                                          r"this config trains 3"):
        load_config(["server.aggregator.name=krum", "data.num_clients=6", "trainer.participation=0.5"])
    with pytest.raises(ConfigError, match=r"server.aggregator.m=4 exceeds the 3 clients a round"):
        load_config(["server.aggregator.name=krum", "server.aggregator.f=0", "server.aggregator.m=4",
                     "data.num_clients=6", "trainer.participation=0.5"])
    assert load_config(["server.aggregator.name=krum", "data.num_clients=10", "trainer.participation=0.5"])
    assert load_config(["server.aggregator.name=krum", "data.num_clients=6", "trainer.sampling=bernoulli"])
    two = aggregate("krum", kept([[0.0], [4.0]]), f=1)  # n = 2: each scored by the other, the tie to client 0
    assert torch.equal(two["w"], torch.tensor([0.0]))


def test_the_geometric_median_of_a_right_triangle_is_its_fermat_point():
    """(0,0), (1,0), (0,1) with equal weights: the point (t, t) where every side subtends 120 degrees, t = (3 -
    sqrt(3)) / 6 (minimise sqrt(2) t + 2 sqrt((1-t)^2 + t^2): 6t^2 - 6t + 1 = 0)."""
    points = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    uploads = Uploads.kept([ClientUpload(cid, {"w": p}, 5.0) for cid, p in enumerate(points)])
    got = aggregate("geometric_median", uploads, iterations=200, nu=1e-12, tolerance=0.0)["w"]
    t = (3 - math.sqrt(3)) / 6
    torch.testing.assert_close(got, torch.tensor([t, t], dtype=torch.float64), rtol=0, atol=1e-9)


def test_one_weiszfeld_step_by_hand_and_the_weights_count():
    """From the weighted mean z0, one step is sum_i x_i b_i / sum_i b_i with b_i = a_i / ||z0 - x_i||."""
    xs, ws = [0.0, 1.0, 10.0], [1.0, 1.0, 2.0]
    uploads = Uploads.kept([ClientUpload(cid, {"w": torch.tensor([x], dtype=torch.float64)}, w)
                            for cid, (x, w) in enumerate(zip(xs, ws))])
    z0 = sum(x * w for x, w in zip(xs, ws)) / sum(ws)
    b = [w / abs(z0 - x) for x, w in zip(xs, ws)]
    z1 = sum(x * bi for x, bi in zip(xs, b)) / sum(b)
    got = aggregate("geometric_median", uploads, iterations=1, tolerance=0.0)["w"].item()
    assert got == pytest.approx(z1, rel=1e-14, abs=0)
    # a weight above half of the total makes its point the minimiser: 10 of weights 1, 1, 3
    heavy = Uploads.kept([ClientUpload(cid, {"w": torch.tensor([x], dtype=torch.float64)}, w)
                          for cid, (x, w) in enumerate(zip(xs, [1.0, 1.0, 3.0]))])
    assert aggregate("geometric_median", heavy, iterations=100, nu=1e-12, tolerance=0.0)["w"].item() == \
        pytest.approx(10.0, abs=1e-6)


def test_norm_clipping_by_hand():
    """Updates from x = (1, 1): (3, 4) of norm 5 with weight 1 and (0, 1) with weight 3; M = 2.5 scales the first
    to (1.5, 2): x + (1.5 * 1 + 0 * 3, 2 * 1 + 1 * 3) / 4 = (1.375, 2.25). A bound no update reaches is the weighted
    mean (1.75, 2.75)."""
    start = {"w": torch.tensor([1.0, 1.0]), "n": torch.tensor(0)}
    uploads = kept([[4.0, 5.0], [1.0, 2.0]], weights=[1.0, 3.0], counters=[2, 7])
    got = aggregate("norm_clip", uploads, start, max_norm=2.5)
    assert torch.equal(got["w"], torch.tensor([1.375, 2.25])) and got["n"].item() == 7
    assert torch.equal(aggregate("norm_clip", uploads, start, max_norm=100.0)["w"], torch.tensor([1.75, 2.75]))
    assert torch.equal(aggregate("norm_clip", kept([[1.0, 1.0]]), start, max_norm=1.0)["w"], start["w"])  # no update


CHUNKED = {"median": {}, "trimmed_mean": {"trim_fraction": 0.2}, "krum": {"f": 1, "m": 2},
           "norm_clip": {"max_norm": 3.0}, "geometric_median": {"iterations": 3}}


@pytest.mark.parametrize("name", CHUNKED)
def test_chunks_of_coordinates_give_the_same_result(monkeypatch, name):
    gen = torch.Generator().manual_seed(1)
    rows = (torch.randn(6, 4, 5, generator=gen)).tolist()
    whole = aggregate(name, kept(rows), **CHUNKED[name])["w"]
    monkeypatch.setattr(aggregation, "CHUNK_ELEMENTS", 13)  # 2 coordinates of 6 clients per chunk
    chunked = aggregate(name, kept(rows), **CHUNKED[name])["w"]
    if name in ("median", "trimmed_mean"):  # each coordinate on its own: the same bits
        assert torch.equal(chunked, whole)
    else:  # distances summed chunk by chunk: the same up to float64 rounding
        torch.testing.assert_close(chunked, whole, rtol=1e-6, atol=0)


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
    med = global_params(run_tiny(out, "trainer.rounds=1", "server.aggregator.name=median", name="median"))
    stacked = {k: torch.stack([p[k] for _, _, p, _ in sent]) for k in med}
    assert len(sent) == 3 and all(torch.equal(med[k], stacked[k].median(dim=0).values) for k in med)
    trim = global_params(run_tiny(out, "trainer.rounds=1", "server.aggregator.name=trimmed_mean",
                                  "server.aggregator.trim_fraction=0.34", name="trim"))
    assert all(torch.equal(trim[k], med[k]) for k in med)


def test_a_fedprox_krum_round_keeps_the_upload_krum_chooses(out, monkeypatch):
    """FedProx's clients with Krum on the server (f = 0, 3 clients a round: each scored by its nearest other): the new
    global model is the upload with the smallest distance to its nearest neighbour, found here from the recorded
    uploads by plain loops."""
    from fl.methods.fedprox import FedProxClient

    sent = record_uploads(monkeypatch, FedProxClient)
    got = global_params(run_tiny(out, "method.name=fedprox", "method.mu=0.1", "trainer.rounds=1",
                                 "server.aggregator.name=krum", "server.aggregator.f=0", name="krum"))
    flat = [torch.cat([p.double().flatten() for p in params.values() if p.is_floating_point()])
            for _, _, params, _ in sorted(sent, key=lambda s: s[1])]
    nearest = [min(float((a - b).pow(2).sum()) for j, b in enumerate(flat) if j != i) for i, a in enumerate(flat)]
    chosen = sorted(sent, key=lambda s: s[1])[nearest.index(min(nearest))][2]
    assert len(sent) == 3 and all(torch.equal(got[k], chosen[k]) for k in got if got[k].is_floating_point())


def test_every_method_whose_server_takes_the_mean_accepts_every_aggregator():
    """The methods docs/aggregators.md names as composing with any aggregator do, from the registry's refusals; the
    others refuse in one line."""
    registry.load_plugins()
    composes = sorted(m for m, spec in registry.METHODS.items() if spec.client_cls.__module__.startswith("fl.")
                      and spec.server_cls.own_aggregation(registry.METHODS[m].config_cls()) is None)
    assert {"fedavg", "fedprox", "scaffold", "fedper", "fedrep", "fedbabu", "ditto", "pfedme"} <= set(composes)
    for method in ("fedprox", "scaffold", "fedbabu", "ditto"):
        for name in registry.AGGREGATORS:
            cfg = load_config([f"method.name={method}", f"server.aggregator.name={name}"])
            assert cfg.server.aggregator.name == name


def test_trimmed_mean_0_equals_the_streamed_mean_under_uniform_weights(out):
    """SCAFFOLD with uniform weights and server_lr 1: its server step gets the uploads' unweighted mean, streamed
    (mean) or kept and trimmed by nothing (trimmed_mean, beta 0): the same run, bit for bit."""
    extra = ("method.name=scaffold", "method.param_weighting=uniform")
    a = run_tiny(out, *extra, name="mean")
    b = run_tiny(out, *extra, "server.aggregator.name=trimmed_mean", "server.aggregator.trim_fraction=0",
                 name="trim0")
    robust = read_metrics(b)  # a robust rule also counts the faulty uploads it left out: none here
    assert all(row.pop("server/faulty_uploads") == 0.0 for row in robust)
    assert read_metrics(a) == robust
    ga, gb = global_params(a), global_params(b)
    assert ga.keys() == gb.keys() and all(torch.equal(ga[k], gb[k]) for k in ga)


def test_a_median_run_resumes_exactly(out, monkeypatch):
    full, cut = interrupted_and_resumed(out, monkeypatch, "server.aggregator.name=median", "trainer.rounds=4",
                                        "trainer.checkpoint_every=10")
    assert read_metrics(cut) == read_metrics(full)
    ga, gb = global_params(full), global_params(cut)
    assert all(torch.equal(ga[k], gb[k]) for k in ga)


@pytest.mark.parametrize("arg, said", [
    ("server.aggregator=median", "server.aggregator is a group now; write server.aggregator.name='median'"),
    ("server.trim_fraction=0.2", "server.trim_fraction moved to server.aggregator.trim_fraction"),
])
def test_the_old_spellings_are_refused_naming_the_new_ones(arg, said, capsys, tmp_path):
    assert main([arg]) == 2
    err = capsys.readouterr().err
    assert err == f"error: command line: {said}\n"
    conf = tmp_path / "old.yaml"
    key, value = arg.split("=")
    conf.write_text(f"include: [quickstart]\nserver:\n  {key.split('.')[1]}: {value}\n")
    with pytest.raises(ConfigError, match=f"^{conf}: {said}"):
        load_config([f"conf={conf}"])


def test_an_aggregators_setting_belongs_to_it():
    with pytest.raises(ConfigError, match=r"^unknown key 'server.aggregator.f': server.aggregator.f is a setting of "
                                          r"server.aggregator.name=krum, not of server.aggregator.name='median'"):
        load_config(["server.aggregator.name=median", "server.aggregator.f=1"])
    with pytest.raises(ConfigError, match=r"^server.aggregator.name='krun' is not valid; did you mean 'krum'\?"):
        load_config(["server.aggregator.name=krun"])


@pytest.mark.parametrize("method", ["confree", "fedpals", "fedacd", "fedas", "fedmosaic", "local"])
def test_methods_whose_aggregation_is_their_own_refuse_another(method):
    with pytest.raises(ConfigError, match=r"server.aggregator.name='median' cannot apply to method.name="):
        load_config([f"method.name={method}", "server.aggregator.name=median", "data.target.distribution=partition",
                     "data.public_size=50"])


def test_the_refusal_is_one_line_and_exit_2_and_other_settings_are_accepted(capsys):
    assert main(["method.name=confree", "server.aggregator.name=trimmed_mean"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "aggregates the uploads itself" in err
    for ok in (["method.name=fedacd", "method.aggregation=uniform"], ["method.name=fedas", "method.weighting=samples"],
               ["method.name=scaffold"], ["method.name=fedrep"]):
        assert load_config([*ok, "server.aggregator.name=median"]).server.aggregator.name == "median"
    with pytest.raises(ConfigError, match="server.aggregator.trim_fraction"):
        load_config(["server.aggregator.name=trimmed_mean", "server.aggregator.trim_fraction=0.5"])


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


def test_a_trim_fraction_that_trims_nothing_is_refused_naming_the_smallest_that_trims(capsys):
    from fl.run.train import main

    assert main(["server.aggregator.name=trimmed_mean", "data.num_clients=6", "trainer.participation=0.5",
                 "--print-config"]) == 2  # 0.1 x 3 clients trims floor(0.3) = 0 values
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: server.aggregator.trim_fraction=0.1 trims floor(0.1 x 3) = 0 values per coordinate")
    assert "raise it to at least 0.334" in err and "\n" not in err
    assert main(["server.aggregator.name=trimmed_mean", "server.aggregator.trim_fraction=0.334", "data.num_clients=6",
                 "trainer.participation=0.5", "--print-config"]) == 0  # trims 1 value a side
    assert main(["server.aggregator.name=trimmed_mean", "server.aggregator.trim_fraction=0", "data.num_clients=6",
                 "trainer.participation=0.5", "--print-config"]) == 0  # the unweighted mean, asked for


def test_an_unknown_name_says_how_a_plugins_name_is_found():
    from fl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"^server.aggregator.name='krumm' is not valid; did you mean 'krum'\?; "
                                          r"choices: .*; a plug-in's name is there once its module is imported: "
                                          r"plugins=\[package.module\], or its package installed with an fl.plugins"):
        load_config(["server.aggregator.name=krumm"])
