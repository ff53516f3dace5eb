"""Methods with a second, personal model beside the global one: Ditto, APFL, pFedMe, Per-FedAvg and FedPHP
(fl/methods/{ditto,apfl,pfedme,perfedavg,fedphp}.py). Each method's defining property, checkpoint/resume of
their per-client state, and 1-vs-2 processes (APFL)."""
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fl.config import load_config
from fl.core import batch_indices
from fl.core.loop import sample_clients
from fl.core.seeding import generator
from fl.data import build_data
from fl.methods.fedphp import hpm_weight
from fl.methods.perfedavg import hessian_vector_fd, loss_and_grad
from fl.methods.pfedme import solve_inner
from tests.helpers import (
    assert_same_rows,
    initial_model,
    interrupted_and_resumed,
    read_metrics,
    tiny,
)
from tests.helpers import load_ckpt as ckpt
from tests.helpers import run_tiny as run
from tests.process_pairs import on_one_and_two_processes


def test_ditto_with_lambda_zero_trains_the_personal_model_as_local_does(out):
    loc = run(out, "method.name=local", "optim.momentum=0.9", name="local")
    dit = run(out, "method.name=ditto", "method.lam=0", "optim.momentum=0.9", name="ditto")
    a, b = read_metrics(loc), read_metrics(dit)
    acc = [k for k in a[-1] if k.startswith("client/") and k.endswith("/acc")]
    assert acc and all(ra[k] == rb[k] for ra, rb in zip(a, b) for k in acc)
    assert [r["test/acc_mean_clients"] for r in a] == [r["test/acc_mean_clients"] for r in b]
    sa, sb = ckpt(loc)["clients"], ckpt(dit)["clients"]
    assert sa.keys() == sb.keys()
    for cid in sa:
        pa, pb = sa[cid]["private"], sb[cid]["private"]
        assert {k.replace("model.", "personal.", 1) for k in pa} == set(pb)
        assert all(torch.equal(v, pb[k.replace("model.", "personal.", 1)]) for k, v in pa.items())
    # with lam > 0 the proximal term pulls the personal models toward the global one
    far = run(out, "method.name=ditto", "method.lam=5", "optim.momentum=0.9", name="ditto5")
    assert read_metrics(far)[-1]["train/prox"] < read_metrics(run(out, "method.name=ditto", "method.lam=0.01",
                                                                    name="ditto001"))[-1]["train/prox"]


def test_apfl_with_alpha_fixed_at_zero_equals_fedavg_and_adaptive_alpha_moves(out):
    avg = run(out, "method.name=fedavg", "optim.momentum=0.9", name="avg")
    apf = run(out, "method.name=apfl", "method.alpha=0", "method.adaptive=false", "optim.momentum=0.9", name="apfl0")
    ga, gb = ckpt(avg)["server"]["global_params"], ckpt(apf)["server"]["global_params"]
    assert ga.keys() == gb.keys() and all(torch.equal(ga[k], gb[k]) for k in ga)
    keys = ["test/acc_mean_clients", "test/acc_weighted", "test/acc_global_micro"]
    keys += [f"client/{i}/acc" for i in range(6)]
    a, b = read_metrics(avg), read_metrics(apf)
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]
    states = ckpt(run(out, "method.name=apfl", "method.alpha=0.5", "method.alpha_lr=0.5", name="apfl"))["clients"]
    alphas = [float(s["alpha"]) for s in states.values()]
    assert all(0.0 <= a <= 1.0 for a in alphas) and any(a != 0.5 for a in alphas)


def test_apfl_alpha_step_is_the_inner_product_with_the_mixed_gradient(out):
    """One client, one local step on a logistic model with plain SGD: alpha_1 = alpha_0 - lr <v - w, grad f(vbar)>,
    v_1 = v_0 - lr alpha_0 grad f(vbar), w_1 = w_0 - lr grad f(w_0)."""
    extra = ("model.name=logistic", "trainer.rounds=1", "trainer.participation=0.1", "trainer.local_steps=1",
             "optim.lr=0.1", "optim.momentum=0", "method.name=apfl", "method.alpha=0.3")
    state = ckpt(run(out, *extra, name="one"))
    cfg = load_config(tiny(out, *extra))
    data = build_data(cfg)
    model = initial_model(cfg, data)
    (cid,) = sample_clients(cfg.seed, 0, data.num_clients, cfg.trainer.participation)
    train = data.clients[cid].train
    (_, idx), = [b for b in batch_indices(len(train), cfg.trainer.batch_size, generator(cfg.seed, 0, cid, "train"),
                                          steps=1) if b[1] is not None]
    x, y = data.prepare(train.x[idx]), train.y[idx]
    w0 = {k: v.detach().clone() for k, v in model.named_parameters()}
    v0 = {k: v.clone() for k, v in w0.items()}  # v starts at w^0 too, so v - w = 0 on the first step
    # perturb nothing: check the first-step closed form, where <v - w, g> = 0 keeps alpha at 0.3
    assert float(state["clients"][cid]["alpha"]) == pytest.approx(0.3, abs=1e-7)
    vbar = {k: 0.3 * v0[k] + 0.7 * w0[k] for k in w0}
    _, g_bar = loss_and_grad(model, vbar, x, y)
    _, g_w = loss_and_grad(model, w0, x, y)
    for k in w0:
        torch.testing.assert_close(state["clients"][cid]["private"][f"local.{k}"], v0[k] - 0.1 * 0.3 * g_bar[k])
        torch.testing.assert_close(state["server"]["global_params"][f"model.{k}"], w0[k] - 0.1 * g_w[k])
    # second step (a second round): v != w now, so alpha moves by -lr <v - w, grad f(vbar)>
    extra2 = tuple(e for e in extra if not e.startswith("trainer.rounds")) + ("trainer.rounds=2",
                                                                              "trainer.participation=1.0")
    st = ckpt(run(out, *extra2, name="two"))
    cfg2 = load_config(tiny(out, *extra2))
    for c in range(data.num_clients):
        s1 = st["clients"][c]
        assert float(s1["alpha"]) != pytest.approx(0.3, abs=1e-9)  # moved in round 1
    # recompute client 0's round-1 alpha step by hand from the round-0 results
    round0 = ckpt(run(out, *(extra2[:-2] + ("trainer.rounds=1", "trainer.participation=1.0")), name="r0"))
    w1 = {k: round0["server"]["global_params"][f"model.{k}"] for k in w0}
    v1 = {k: round0["clients"][0]["private"][f"local.{k}"] for k in w0}
    a1 = float(round0["clients"][0]["alpha"])
    train0 = data.clients[0].train
    (_, idx), = [b for b in batch_indices(len(train0), cfg2.trainer.batch_size,
                                          generator(cfg2.seed, 1, 0, "train"), steps=1) if b[1] is not None]
    x, y = data.prepare(train0.x[idx]), train0.y[idx]
    _, g_bar = loss_and_grad(model, {k: a1 * v1[k] + (1 - a1) * w1[k] for k in w0}, x, y)
    expected = a1 - 0.1 * sum(float(((v1[k] - w1[k]) * g_bar[k]).sum()) for k in w0)
    assert float(st["clients"][0]["alpha"]) == pytest.approx(min(max(expected, 0.0), 1.0), abs=1e-6)


def test_pfedme_inner_solver_reaches_tolerance_and_the_outer_step_is_the_envelope_gradient(out):
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)
    x, y = torch.randn(32, 5), torch.randint(0, 3, (32,))
    w = [p.detach().clone() + 0.3 for p in model.parameters()]
    theta = list(model.parameters())
    _, norm = solve_inner(theta, w, lambda: F.cross_entropy(model(x), y), lam=5.0, lr=0.1, steps=300)
    h = F.cross_entropy(model(x), y) + 2.5 * sum(torch.sum((t - wi) ** 2) for t, wi in zip(theta, w))
    grad_h = torch.autograd.grad(h, theta)
    assert float(torch.sqrt(sum(torch.sum(g * g) for g in grad_h))) < 1e-6 and float(norm) < 1e-5

    # in a run: one client, one local step, K large, plain SGD: theta solves the inner problem at w^0
    # and the new global model is w^0 - eta lam (w^0 - theta)
    extra = ("model.name=logistic", "trainer.rounds=1", "trainer.participation=0.1", "trainer.local_steps=1",
             "optim.lr=0.05", "optim.momentum=0", "method.name=pfedme", "method.K=300", "method.lam=5",
             "method.personal_lr=0.05")
    state = ckpt(run(out, *extra, name="pfedme"))
    cfg = load_config(tiny(out, *extra))
    data = build_data(cfg)
    model = initial_model(cfg, data)
    (cid,) = sample_clients(cfg.seed, 0, data.num_clients, cfg.trainer.participation)
    train = data.clients[cid].train
    (_, idx), = [b for b in batch_indices(len(train), cfg.trainer.batch_size, generator(cfg.seed, 0, cid, "train"),
                                          steps=1) if b[1] is not None]
    x, y = data.prepare(train.x[idx]), train.y[idx]
    w0 = {k: v.detach().clone() for k, v in model.named_parameters()}
    theta = {k: state["clients"][cid]["private"][f"personal.{k}"].clone().requires_grad_(True) for k in w0}
    from torch.func import functional_call
    h = F.cross_entropy(functional_call(model, theta, (x,)), y) + 2.5 * sum(
        torch.sum((theta[k] - w0[k]) ** 2) for k in w0)
    grad_h = torch.autograd.grad(h, list(theta.values()))
    assert float(torch.sqrt(sum(torch.sum(g * g) for g in grad_h))) < 1e-4
    assert max(float((theta[k].detach() - w0[k]).abs().max()) for k in w0) > 1e-3  # theta did move away from w
    for k in w0:
        torch.testing.assert_close(state["server"]["global_params"][f"model.{k}"],
                                   w0[k] - 0.05 * 5 * (w0[k] - theta[k].detach()), rtol=1e-5, atol=1e-6)


def test_perfedavg_evaluates_each_client_after_one_adaptation_step(out):
    extra = ("model.name=logistic", "trainer.rounds=2", "method.name=perfedavg", "method.alpha=0.05")
    run_dir = run(out, *extra, name="pfa")
    rows, state = read_metrics(run_dir), ckpt(run_dir)
    cfg = load_config(tiny(out, *extra))
    data = build_data(cfg)
    model = initial_model(cfg, data)
    g = {k.removeprefix("model."): v for k, v in state["server"]["global_params"].items()}
    rnd = cfg.trainer.rounds - 1
    changed = 0
    for cid in range(data.num_clients):
        model.load_state_dict(g)
        train, test = data.clients[cid].train, data.clients[cid].test
        (_, idx), = [b for b in batch_indices(len(train), cfg.trainer.batch_size,
                                              generator(cfg.seed, rnd, cid, "adapt"), steps=1) if b[1] is not None]
        grads = torch.autograd.grad(F.cross_entropy(model(data.prepare(train.x[idx])), train.y[idx]),
                                    list(model.parameters()))
        with torch.no_grad():
            before = (model(data.prepare(test.x)).argmax(1) == test.y).float().mean().item()
            for p, gr in zip(model.parameters(), grads):
                p -= 0.05 * gr
            acc = (model(data.prepare(test.x)).argmax(1) == test.y).float().mean().item()
        assert rows[-1][f"client/{cid}/acc"] == pytest.approx(acc, abs=1e-6), cid
        changed += before != acc
    assert changed > 0  # the adaptation step matters
    # without adaptation the clients score the global model, as FedAvg's clients do
    none = read_metrics(run(out, *extra, "method.adapt_steps=0", name="pfa0"))
    assert none[-1]["test/acc_global_micro"] == rows[-1]["test/acc_global_micro"]


def test_perfedavg_hessian_free_estimate_matches_the_hessian_vector_product():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()
    x, y = torch.randn(40, 6, dtype=torch.float64), torch.randint(0, 3, (40,))
    w = {k: p.detach() for k, p in model.named_parameters()}
    v = {k: torch.randn_like(p) for k, p in w.items()}
    approx = hessian_vector_fd(model, w, v, x, y, delta=1e-4)
    from torch.func import functional_call
    _, exact = torch.autograd.functional.hvp(
        lambda *ps: F.cross_entropy(functional_call(model, dict(zip(w, ps)), (x,)), y), tuple(w.values()),
        tuple(v.values()))
    for k, e in zip(w, exact):
        torch.testing.assert_close(approx[k], e, rtol=1e-5, atol=1e-7)
    assert max(float(e.abs().max()) for e in exact) > 1e-3


def test_perfedavg_hf_and_fo_differ_and_both_train(out):
    fo = read_metrics(run(out, "method.name=perfedavg", "method.variant=fo", name="fo"))
    hf = read_metrics(run(out, "method.name=perfedavg", "method.variant=hf", name="hf"))
    assert fo[0]["train/loss"] != hf[0]["train/loss"]  # the Hessian correction changes the first round already
    assert fo[-1]["train/loss"] < fo[0]["train/loss"] and hf[-1]["train/loss"] < hf[0]["train/loss"]


def test_fedphp_hpm_is_the_moving_average_of_the_local_models(out):
    """lam = 0: training is FedAvg; the HPM is w_k^0 after the first visit, then mu_1 HPM + (1 - mu_1) w_k^1 with
    mu_1 = 0.9 * 1 / (Q T) = 0.45 (full participation, T = 2). Local models recomputed by a hand-written loop."""
    extra = ("model.name=logistic", "trainer.rounds=2", "trainer.participation=1.0", "optim.momentum=0")
    phpd = ckpt(run(out, "method.name=fedphp", "method.lam=0", "method.mu=0.9", *extra, name="php"))
    avg = ckpt(run(out, "method.name=fedavg", *extra, name="avg"))
    ga, gb = avg["server"]["global_params"], phpd["server"]["global_params"]
    assert all(torch.equal(ga[k], gb[k]) for k in ga)
    assert hpm_weight(0.9, 0, 1.0, 2) == 0.0 and hpm_weight(0.9, 1, 1.0, 2) == 0.45
    assert hpm_weight(0.9, 5, 1.0, 2) == 0.9
    cfg = load_config(tiny(out, *extra))
    data = build_data(cfg)
    model = initial_model(cfg, data)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    hpm: dict[int, dict] = {}
    for rnd in range(2):
        sums, total = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in state.items()}, 0
        for cid in range(data.num_clients):
            model.load_state_dict(state)
            opt = torch.optim.SGD(model.parameters(), lr=cfg.optim.lr)
            train = data.clients[cid].train
            for _, idx in batch_indices(len(train), cfg.trainer.batch_size, generator(cfg.seed, rnd, cid, "train"),
                                        epochs=cfg.trainer.local_epochs):
                if idx is not None:
                    opt.zero_grad()
                    F.cross_entropy(model(data.prepare(train.x[idx])), train.y[idx]).backward()
                    opt.step()
            local = {k: v.detach().clone() for k, v in model.state_dict().items()}
            mu = 0.0 if rnd == 0 else 0.45
            hpm[cid] = local if rnd == 0 else {k: mu * hpm[cid][k] + (1 - mu) * local[k] for k in local}
            for k, v in local.items():
                sums[k] += len(train) * v.double()
            total += len(train)
        state = {k: (s / total).float() for k, s in sums.items()}
    for cid, h in hpm.items():
        got = phpd["clients"][cid]
        assert got["visits"] == 2
        for k, v in h.items():
            torch.testing.assert_close(got["private"][f"hpm.{k}"], v, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["ditto", "apfl", "pfedme", "perfedavg", "fedphp"])
def test_resume_restores_every_clients_state(out, method, monkeypatch):
    """Interrupted (Ctrl-C) in round 2 of 4, then resumed: the same run as an uninterrupted one, client states
    included (the run length is not changed, since FedPHP's moving-average schedule depends on it)."""
    extra = (f"method.name={method}", "trainer.rounds=4", "trainer.checkpoint_every=10")
    full, cut = interrupted_and_resumed(out, monkeypatch, *extra)
    assert read_metrics(cut) == read_metrics(full)
    a, b = ckpt(full), ckpt(cut)
    assert all(torch.equal(v, b["server"]["global_params"][k]) for k, v in a["server"]["global_params"].items())
    assert a["clients"].keys() == b["clients"].keys()
    for cid, s in a["clients"].items():
        assert s.keys() == b["clients"][cid].keys()
        for k, v in s["private"].items():
            assert torch.equal(v, b["clients"][cid]["private"][k])
        for k in set(s) - {"private"}:
            assert torch.equal(torch.as_tensor(s[k]), torch.as_tensor(b["clients"][cid][k])), k


@on_one_and_two_processes("apfl", "method.name=apfl", "trainer.rounds=3", "data.num_clients=7",
                          "trainer.participation=0.6")
def apfl_same_on_one_and_two_processes(one: Path, two: Path) -> None:
    a, b = read_metrics(one), read_metrics(two)
    assert len(a) == 3
    assert_same_rows(a, b, abs=1e-5)
    ca, cb = ckpt(one), ckpt(two)
    for k, v in ca["server"]["global_params"].items():
        torch.testing.assert_close(cb["server"]["global_params"][k], v, rtol=0, atol=1e-5)
    assert ca["clients"].keys() == cb["clients"].keys()
    for cid, s in ca["clients"].items():
        torch.testing.assert_close(cb["clients"][cid]["alpha"], s["alpha"], rtol=0, atol=1e-6)
        for k, v in s["private"].items():
            torch.testing.assert_close(cb["clients"][cid]["private"][k], v, rtol=0, atol=1e-5)


@pytest.mark.parametrize("conf, method, hp", [
    ("ditto_cifar10_dir05", "ditto", {"lam": 1.0}), ("apfl_cifar10_dir05", "apfl", {"alpha": 0.25}),
    ("pfedme_cifar10_dir05", "pfedme", {"lam": 5.0}), ("perfedavg_domainnet_hybrid30", "perfedavg", {"variant": "fo"}),
    ("fedphp_domainnet_hybrid30", "fedphp", {"reg": "mmd", "lam": 0.1})])
def test_paper_configs_and_their_synthetic_twins_load(conf, method, hp):
    real, twin = load_config([f"conf={conf}"]), load_config([f"conf={conf}_synthetic"])
    assert real.method.name == twin.method.name == method
    assert all(real.method[k] == twin.method[k] == v for k, v in hp.items())
    assert twin.data.name.startswith("embedded") and not real.data.name.startswith("embedded")
    assert real.data.partition.name == twin.data.partition.name
    assert real.trainer.participation == twin.trainer.participation
