"""ConFREE (fl/methods/confree.py), a FedDRM baseline: the server step by hand on fabricated updates (Stage 1's
projections onto the normal planes of the original updates, Stage 2's max-min step in the ball, the weights, the
rescaling, per-layer scope), the paper's guarantees (the step serves every client of a two-client conflict; d* is the
best worst-client step in the ball), FedRep's average exactly without conflicts at c = 0, end to end: one-client
rounds are FedRep's at c = 0 and (1 + c) times its step otherwise, a round equals the step on the uploaded messages,
resume equals uninterrupted (its configs: tests/config/test_baseline_configs.py)."""
import functools
import math
from pathlib import Path

import pytest
import torch

from fl.config import ConfigError, load_config
from fl.core import Upload
from fl.core.aggregation import ClientUpload, Uploads
from fl.core.exchange import WeightedSum
from fl.core.server import Server
from fl.data import build_data
from fl.methods import confree
from fl.methods.confree import ConFREEServer, aggregate
from fl.methods.fedrep import FedRepClient
from tests.helpers import (
    assert_same_rows,
    global_params,
    initial_model,
    interrupted_and_resumed,
    load_ckpt,
    read_metrics,
    record_uploads,
    run_tiny,
    tiny,
)
from tests.process_pairs import on_one_and_two_processes


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # hand computations reduce in the same order as the runs (fabric.cpu_threads=1)


def rows(run_dir, drop_server: bool = False) -> list[dict]:
    return [{k: v for k, v in r.items() if not (drop_server and k.startswith("server/"))}
            for r in read_metrics(run_dir)]


@functools.cache
def method_config(*extra: str):
    return load_config(["method.name=confree", *extra])


def server(*extra) -> ConFREEServer:
    return ConFREEServer(method_config(*extra))


def step(theta: dict, deltas: list[dict], n: list[float], *extra) -> tuple[dict, ConFREEServer]:
    """One aggregation and server step of a ConFREEServer on fabricated uploads: client i trained theta + deltas[i],
    has n[i] samples; clients are given out of order (the uploads come sorted)."""
    s = server(*extra)
    s.keys = list(theta)
    s.global_params = {k: v.clone() for k, v in theta.items()}
    uploads = Uploads.kept([ClientUpload(cid, {k: theta[k] + d[k] for k in theta}, s.weight(cid, Upload(weight=ni)))
                            for cid, d, ni in reversed(list(zip(range(len(deltas)), deltas, n)))])
    s.server_step(None, s.aggregate(uploads), {})
    return s.global_params, s


def vec(*x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


# ---- the server step by hand -----------------------------------------------------------------------------------------
THETA = {"w": vec(0.25, -0.5)}
D1, D2 = vec(2.0, 0.0), vec(-1.0, 1.0)  # D1 . D2 = -2 < 0: a conflict


def test_two_conflicting_updates_by_hand():
    """Eq. 3: D1 - (D1.D2/||D2||^2) D2 = (1, 1) and D2 - (D1.D2/||D1||^2) D1 = (0, 1), averaged (1/N) -> (0.5, 1);
    weighted by n = (3, 1) -> (0.75, 1). Both are orthogonal to one update and agree with the other."""
    new, s = step(THETA, [{"w": D1}, {"w": D2}], [3, 1], "method.c=0")
    torch.testing.assert_close(new["w"], THETA["w"] + vec(0.5, 1.0), rtol=0, atol=1e-12)
    assert s._round["server/conflicts"] == 1.0
    new, _ = step(THETA, [{"w": D1}, {"w": D2}], [3, 1], "method.c=0", "method.weighting=samples")
    d = new["w"] - THETA["w"]
    torch.testing.assert_close(d, vec(0.75, 1.0), rtol=0, atol=1e-12)
    assert float(d @ D1) > 0 and float(d @ D2) > 0


@pytest.mark.parametrize("c", [0.1, 0.3, 0.5, 0.9])
def test_stage_two_by_hand(c):
    """Delta_perp = g = (0.5, 1), r = c ||g||; d* maximises min(d . D1, d . D2) over ||d - g|| <= r (Eq. 4).
    Small ball (c < 1 / (4 sqrt(2.5)) = 0.158..., D2 stays the worse client): d* = g + r D2 / ||D2||.
    Larger: d* lies where d . D1 = d . D2, on the line d = s (1, 3), at the farthest point of the ball:
    s = g.(1,3)/10 + sqrt(r^2 - dist^2)/sqrt(10), dist = g.(3,-1)/sqrt(10) its distance from g.
    rescale=true divides d* by 1 + c^2."""
    g = vec(0.5, 1.0)
    r2 = c * c * float(g @ g)
    if c < 1 / (4 * math.sqrt(2.5)):
        expected = g + math.sqrt(r2) * D2 / D2.norm()
        assert float(expected @ D2) < float(expected @ D1)
    else:
        expected = (float(g @ vec(1, 3)) / 10 + math.sqrt(r2 - float(g @ vec(3, -1)) ** 2 / 10) / math.sqrt(10)
                    ) * vec(1.0, 3.0)
    new, st = step(THETA, [{"w": D1}, {"w": D2}], [3, 1], f"method.c={c}")
    d = new["w"] - THETA["w"]
    torch.testing.assert_close(d, expected, rtol=0, atol=1e-12)
    assert float((d - g).norm()) == pytest.approx(math.sqrt(r2), rel=1e-12)  # on the ball's boundary
    assert min(float(d @ D1), float(d @ D2)) > float(g @ D2)  # the worse client gains
    worst = min(float(d @ x) / float(d.norm() * x.norm()) for x in (D1, D2))
    assert st._round["server/worst_cos"] == pytest.approx(worst, rel=1e-9)
    new, _ = step(THETA, [{"w": D1}, {"w": D2}], [3, 1], f"method.c={c}", "method.rescale=true")
    torch.testing.assert_close(new["w"] - THETA["w"], expected / (1 + c * c), rtol=0, atol=1e-12)


def test_three_clients_project_against_the_original_updates_all_at_once():
    """D1 = (2, 0), D2 = (-1, 1), D3 = (1, -2): pairs (1,2) and (2,3) conflict, (1,3) do not. Each update drops its
    components along the original updates it conflicts with (Eq. 3), so no order enters."""
    d1, d2, d3 = D1, D2, vec(1.0, -2.0)
    p1 = d1 - (-2 / 2) * d2
    p2 = d2 - (-2 / 4) * d1 - (-3 / 5) * d3
    p3 = d3 - (-3 / 2) * d2
    torch.testing.assert_close(torch.stack([p1, p2, p3]), vec(1, 1, 0.6, -0.2, -0.5, -0.5).view(3, 2))
    for n in ([1, 1, 1], [1, 5, 2]):
        for order in ([d1, d2, d3], [d3, d1, d2]):
            new, s = step(THETA, [{"w": d} for d in order], n, "method.c=0", "method.weighting=uniform")
            torch.testing.assert_close(new["w"], THETA["w"] + (p1 + p2 + p3) / 3, rtol=0, atol=1e-12)
            assert s._round["server/conflicts"] == pytest.approx(2 / 3)


def test_cancelling_updates_leave_the_model():
    """D2 = -D1: each projection removes the whole update; Delta_perp = 0 and so is the ball (any c)."""
    new, _ = step(THETA, [{"w": D1}, {"w": -D1}], [1, 1], "method.c=0.7")
    torch.testing.assert_close(new["w"], THETA["w"], rtol=0, atol=1e-12)


def test_one_client_moves_by_one_plus_c_times_its_update():
    """N = 1: Delta_perp = D, w* = 1, d* = D + c ||D|| D / ||D|| (Algorithm 1 as written)."""
    new, s = step(THETA, [{"w": D2}], [4], "method.c=0.4")
    torch.testing.assert_close(new["w"], THETA["w"] + 1.4 * D2, rtol=0, atol=1e-12)
    assert s._round["server/conflicts"] == 0.0


def random_updates(n: int, dim: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return list(torch.randn(n, dim, generator=gen, dtype=torch.float64))


@pytest.mark.parametrize("c", [0.0, 0.5])
def test_two_client_steps_serve_both_clients(c):
    """With two clients the guidance vector has a non-negative dot product with both original updates (Cauchy-Schwarz
    on the projected one, 0 on the other), and Stage 2 never lowers the worse of the two."""
    for seed in range(30):
        d = random_updates(2, 5, seed)
        new, s = step({"w": torch.zeros(5, dtype=torch.float64)}, [{"w": x} for x in d], [1, 1], f"method.c={c}")
        dots = [float(new["w"] @ x) for x in d]
        assert min(dots) >= -1e-9, (seed, dots)
        if float(d[0] @ d[1]) < 0:
            assert s._round["server/conflicts"] == 1.0


def test_stage_two_is_the_best_worst_client_step_in_the_ball(monkeypatch):
    """Four conflicting updates in 6-d: d* lies in ||d - Delta_perp|| <= c ||Delta_perp|| and no point of the ball (5000
    random ones, on its boundary and inside) has a larger min_j d . Delta_j (Eq. 4)."""
    c = 0.6
    d = random_updates(4, 6, 7)
    z = {"w": torch.zeros(6, dtype=torch.float64)}
    perp, _ = step(z, [{"w": x} for x in d], [1] * 4, "method.c=0")
    best, s = step(z, [{"w": x} for x in d], [1] * 4, f"method.c={c}")
    g, ds, G = perp["w"], best["w"], torch.stack(d)
    assert s._round["server/conflicts"] > 0
    radius = c * float(g.norm())
    assert float((ds - g).norm()) <= radius * (1 + 1e-6)
    gen = torch.Generator().manual_seed(0)
    u = torch.randn(5000, 6, generator=gen, dtype=torch.float64)
    u = u / u.norm(dim=1, keepdim=True) * (torch.rand(5000, 1, generator=gen, dtype=torch.float64) ** 0.2)
    others = (g + radius * u) @ G.T
    assert float((G @ ds).min()) >= float(others.min(dim=1).values.max()) - 1e-12
    assert float((G @ ds).min()) > float((G @ g).min())  # strictly better than the guidance vector here
    monkeypatch.setattr(confree, "polish", lambda *a: None)  # the solver's w* alone is d* to its tolerance
    raw, _ = step(z, [{"w": x} for x in d], [1] * 4, f"method.c={c}")
    torch.testing.assert_close(raw["w"], ds, rtol=0, atol=1e-4)


def test_without_conflicts_and_c_0_the_step_is_fedreps_average_bitwise():
    """Updates with pairwise positive dot products, c = 0, sample weights: the new model is FedRep's weighted mean,
    as the orchestrator sums it (float64 in client order), bit for bit; with c > 0 the worst client gains."""
    gen = torch.Generator().manual_seed(3)
    theta = {"a": torch.randn(4, 3, generator=gen), "b": torch.randn(5, generator=gen)}
    deltas = [{k: 0.1 + torch.rand(v.shape, generator=gen) for k, v in theta.items()} for _ in range(3)]
    n = [5.0, 3.0, 7.0]
    acc = WeightedSum()
    for d, w in zip(deltas, n):
        acc.add({k: theta[k] + d[k] for k in theta}, w)
    fedrep = Server(load_config(["method.name=fedrep"]))
    fedrep.server_step(None, {k: (acc.sums[k] / acc.total).to(torch.float32) for k in theta}, {})
    new, s = step(theta, deltas, n, "method.c=0", "method.weighting=samples")
    assert s._round["server/conflicts"] == 0.0
    assert all(torch.equal(new[k], fedrep.global_params[k]) for k in theta)
    flat = torch.stack([torch.cat([d[k].double().flatten() for k in theta]) for d in deltas])
    moved = {c: torch.cat([(step(theta, deltas, n, f"method.c={c}")[0][k] - theta[k]).double().flatten()
                           for k in theta]) for c in (0.0, 0.5)}
    assert float((flat @ moved[0.5]).min()) > float((flat @ moved[0.0]).min())


def test_layer_scope_treats_each_tensor_as_its_own_problem():
    """scope=layer (the authors' code): each tensor's step is the one-tensor step; scope=model (the paper) sees one
    vector, where the conflict of `a` is outweighed by `b`."""
    theta = {"a": torch.zeros(2, dtype=torch.float64), "b": torch.zeros(3, dtype=torch.float64)}
    deltas = [{"a": D1, "b": vec(1.0, 1.0, 1.0)}, {"a": D2, "b": vec(1.0, 2.0, 0.5)}]
    layer, s = step(theta, deltas, [1, 1], "method.c=0.5", "method.scope=layer")
    for k in theta:
        alone, _ = step({k: theta[k]}, [{k: d[k]} for d in deltas], [1, 1], "method.c=0.5")
        torch.testing.assert_close(layer[k], alone[k], rtol=0, atol=1e-10)
    assert s._round["server/conflicts"] == 0.5  # a conflicts, b does not
    model, s = step(theta, deltas, [1, 1], "method.c=0", "method.scope=model")
    assert s._round["server/conflicts"] == 0.0  # 1.D1.D2 + b's dot product 4.5 > 0: the plain mean
    torch.testing.assert_close(model["a"], (D1 + D2) / 2, rtol=0, atol=1e-12)


# ---- end to end ------------------------------------------------------------------------------------------------------
ONE_CLIENT = ("trainer.participation=0.1", "trainer.local_steps=4", "method.head_steps=2")


def test_one_client_rounds_with_c_0_are_fedrep_exactly(out):
    """One client per round: nothing conflicts, and with c = 0 the global model, the personal heads and every metric
    are FedRep's bit for bit."""
    extra = (*ONE_CLIENT, "trainer.rounds=3")
    rep = run_tiny(out, "method.name=fedrep", *extra, name="rep")
    con = run_tiny(out, "method.name=confree", "method.c=0", *extra, name="con")
    a, b = global_params(rep), global_params(con)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert rows(rep) == rows(con, drop_server=True)
    ca, cb = load_ckpt(rep)["clients"], load_ckpt(con)["clients"]
    assert ca.keys() == cb.keys() and all(torch.equal(ca[c]["private"][k], cb[c]["private"][k])
                                          for c in ca for k in ca[c]["private"])
    assert all(r["server/conflicts"] == 0.0 for r in rows(con))


def test_a_one_client_round_moves_by_one_plus_c_times_fedreps_step(out):
    extra = (*ONE_CLIENT, "trainer.rounds=1")
    rep = global_params(run_tiny(out, "method.name=fedrep", *extra, name="rep"))
    con = global_params(run_tiny(out, "method.name=confree", "method.c=0.5", *extra, name="con"))
    cfg = load_config(tiny(out, "method.name=confree", *extra))
    init = {"model." + k: v for k, v in initial_model(cfg, build_data(cfg)).state_dict().items()}
    moved = 0.0
    for k, v in con.items():
        expected = (init[k].double() + 1.5 * (rep[k].double() - init[k].double())).float()
        torch.testing.assert_close(v, expected, rtol=1e-6, atol=1e-7, msg=k)
        moved = max(moved, float((rep[k] - init[k]).abs().max()))
    assert moved > 1e-3


def test_a_round_is_the_aggregation_of_the_uploads(out, monkeypatch):
    """Three clients: each uploads its trained shared parameters (not its head) as FedRep does, the same bytes; the
    server's aggregate hook gets every one, and the new global model is `aggregate` on them, bitwise, and the
    logged conflicts are theirs."""
    sent = record_uploads(monkeypatch, FedRepClient)
    extra = ("trainer.rounds=1", "trainer.local_steps=3", "method.head_steps=1")
    con = run_tiny(out, "method.name=confree", "method.c=0.5", *extra, name="con")
    sent = list(sent)
    rep = run_tiny(out, "method.name=fedrep", *extra, name="rep")
    assert len(sent) == 3 and all(not any(k.startswith("model.head.") for k in params) for _, _, params, _ in sent)
    cfg = load_config(tiny(out, "method.name=confree", *extra))
    init = {"model." + k: v for k, v in initial_model(cfg, build_data(cfg)).state_dict().items()}
    theta = {k: init[k] for k in sent[0][2]}  # every shared tensor is a parameter: no buffers under GroupNorm
    expected, stats = aggregate(theta, [p for _, _, p, _ in sorted(sent, key=lambda s: s[1])], [1.0] * 3, 0.5)
    got = global_params(con)
    assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in got)
    (row,) = rows(con)
    assert row["server/conflicts"] == stats["server/conflicts"]
    assert row["comm/bytes_up"] == rows(rep)[0]["comm/bytes_up"]


def test_resume_equals_uninterrupted(out, monkeypatch):
    """Interrupted (Ctrl-C) in round 2 of 4, then resumed: the same metrics, global model and personal heads."""
    extra = ("method.name=confree", "method.c=0.5", "trainer.rounds=4", "trainer.checkpoint_every=10",
             "trainer.local_steps=3", "method.head_steps=1")
    full, cut = interrupted_and_resumed(out, monkeypatch, *extra)
    assert rows(cut) == rows(full)
    a, b = load_ckpt(full), load_ckpt(cut)
    assert set(a["server"]) == {"global_params"}  # no server state beyond the global body
    assert all(torch.equal(a["server"]["global_params"][k], b["server"]["global_params"][k])
               for k in a["server"]["global_params"])
    assert a["clients"].keys() == b["clients"].keys()
    assert all(torch.equal(a["clients"][c]["private"][k], b["clients"][c]["private"][k])
               for c in a["clients"] for k in a["clients"][c]["private"])


@on_one_and_two_processes("confree", "method.name=confree", "method.c=0.5", "trainer.rounds=2", "data.num_clients=7",
                          "trainer.participation=0.6", "trainer.local_steps=3", "method.head_steps=1")
def confree_same_on_one_and_two_processes(one: Path, two: Path) -> None:
    """Every process gathers all the messages and runs the same server step in client order: the global body is
    bitwise the same on 1 and 2 processes, and so are the personal heads."""
    assert_same_rows(read_metrics(one), read_metrics(two), abs=1e-6)
    a, b = load_ckpt(one), load_ckpt(two)
    ga, gb = a["server"]["global_params"], b["server"]["global_params"]
    assert ga.keys() == gb.keys() and all(torch.equal(ga[k], gb[k]) for k in ga)
    assert a["clients"].keys() == b["clients"].keys()
    assert all(torch.equal(a["clients"][c]["private"][k], b["clients"][c]["private"][k])
               for c in a["clients"] for k in a["clients"][c]["private"])


def test_config_holds_the_chosen_values_and_rejects_bad_ones():
    m = load_config(["conf=confree_cifar10_dir03"]).method
    assert (m.head_steps, m.c, m.weighting, m.rescale, m.scope) == (5, 0.5, "uniform", False, "model")
    for bad, key in [("method.c=1.0", "method.c"), ("method.c=-0.1", "method.c"),
                     ("method.weighting=size", "method.weighting"), ("method.scope=block", "method.scope"),
                     ("method.head_steps=10", "method.head_steps")]:
        with pytest.raises(ConfigError, match=key):
            load_config(["conf=confree_cifar10_dir03", bad])
