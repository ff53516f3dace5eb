"""SCAFFOLD (fl/methods/scaffold.py): equal to FedAvg while the control variates are zero, the option-II
control-variate update in closed form and against a hand-written loop, the correction changes training
from round 1 on, resume, and 1-vs-2 processes."""

from pathlib import Path

import torch
import torch.nn.functional as F

from fl.config import load_config
from fl.core import batch_indices
from fl.core.loop import sample_clients
from fl.core.seeding import generator
from fl.data import build_data
from fl.run.train import main
from tests.helpers import assert_same_rows, initial_model, read_metrics, tiny
from tests.helpers import load_ckpt as ckpt
from tests.helpers import run_tiny as run
from tests.process_pairs import on_one_and_two_processes


def test_round_0_equals_fedavg_exactly(out):
    avg = run(out, "method.name=fedavg", "trainer.rounds=1", "optim.momentum=0.9", name="avg")
    sca = run(out, "method.name=scaffold", "trainer.rounds=1", "optim.momentum=0.9", name="sca")
    ga, server = ckpt(avg)["server"]["global_params"], ckpt(sca)["server"]
    assert set(server) == {"global_params", "control"}  # x is stored under the base class's key
    gs = server["global_params"]
    assert ga.keys() == gs.keys() and all(torch.equal(ga[k], gs[k]) for k in ga)
    no_comm = lambda row: {k: v for k, v in row.items() if not k.startswith("comm/")}  # noqa: E731
    assert [no_comm(r) for r in read_metrics(avg)] == [no_comm(r) for r in read_metrics(sca)]
    (ra,), (rs,) = read_metrics(avg), read_metrics(sca)
    # SCAFFOLD moves twice FedAvg's bytes each way: (x, c) down, (y, delta c_i) up (no integer buffers here)
    assert rs["comm/bytes_down"] == 2 * ra["comm/bytes_down"] and rs["comm/bytes_up"] == 2 * ra["comm/bytes_up"]
    # every trainable parameter has a control variate, and it moved away from zero
    assert server["control"].keys() == {k for k, v in gs.items() if v.is_floating_point()}
    assert any(v.abs().sum() > 0 for v in server["control"].values())


def test_control_variates_after_one_round_in_closed_form(out):
    # participation 0.1 of 6 clients: one client trains, so the new global model is its y
    extra = ("trainer.rounds=1", "trainer.participation=0.1", "trainer.local_steps=3", "optim.lr=0.05",
             "optim.momentum=0")
    state = ckpt(run(out, "method.name=scaffold", *extra, name="one"))
    cfg = load_config(tiny(out, *extra))
    data = build_data(cfg)
    x0 = {f"model.{k}": v for k, v in initial_model(cfg, data).state_dict().items()}
    (cid,) = sample_clients(cfg.seed, 0, data.num_clients, cfg.trainer.participation)
    assert list(state["clients"]) == [cid]
    y = state["server"]["global_params"]
    c_i = state["clients"][cid]["c_i"]
    c = state["server"]["control"]
    assert c_i.keys() == c.keys() == x0.keys()
    for k in x0:
        expected = (x0[k] - y[k]) / (3 * 0.05)  # c_i+ = c_i - c + (x - y)/(K lr) with c = c_i = 0
        assert expected.abs().max() > 1e-4, k  # the parameter did move
        torch.testing.assert_close(c_i[k], expected, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(c[k], c_i[k] / data.num_clients, rtol=1e-6, atol=1e-8)  # c = sum dc_i / M


def test_equals_a_hand_written_scaffold_loop(out):
    """Algorithm 1 (option II) by hand on a linear model with plain SGD (the quickstart config has momentum):
    3 rounds, half the clients, uniform weights, eta_g = 0.5."""
    extra = ("model.name=logistic", "trainer.rounds=3", "trainer.local_steps=3", "method.name=scaffold",
             "method.param_weighting=uniform", "method.server_lr=0.5", "optim.lr=0.1", "optim.momentum=0")
    state = ckpt(run(out, *extra, name="sca"))
    cfg = load_config(tiny(out, *extra))
    data = build_data(cfg)
    model = initial_model(cfg, data)
    lr, eta, num_clients = cfg.optim.lr, cfg.method.server_lr, data.num_clients
    x = {k: v.detach().clone() for k, v in model.named_parameters()}
    c = {k: torch.zeros_like(v) for k, v in x.items()}
    c_clients: dict[int, dict] = {}
    for rnd in range(cfg.trainer.rounds):
        ys, deltas = [], []
        for cid in sample_clients(cfg.seed, rnd, num_clients, cfg.trainer.participation):
            ci = c_clients.get(cid, {k: torch.zeros_like(v) for k, v in x.items()})
            model.load_state_dict(x)
            train, steps = data.clients[cid].train, 0
            for _, idx in batch_indices(len(train), cfg.trainer.batch_size, generator(cfg.seed, rnd, cid, "train"),
                                        steps=cfg.trainer.local_steps):
                if idx is None:
                    continue
                loss = F.cross_entropy(model(data.prepare(train.x[idx])), train.y[idx])
                grads = torch.autograd.grad(loss, list(model.parameters()))
                with torch.no_grad():
                    for (k, p), g in zip(model.named_parameters(), grads):
                        p -= lr * (g + c[k] - ci[k])
                steps += 1
            y = {k: v.detach().clone() for k, v in model.named_parameters()}
            new = {k: ci[k] - c[k] + (x[k] - y[k]) / (steps * lr) for k in x}
            deltas.append({k: new[k] - ci[k] for k in x})
            c_clients[cid] = new
            ys.append(y)
        x = {k: x[k] + eta * (sum(y[k] for y in ys) / len(ys) - x[k]) for k in x}
        c = {k: c[k] + sum(d[k] for d in deltas) / num_clients for k in c}
    assert rnd >= 1 and any(v.abs().sum() > 0 for v in c.values())  # the correction was active
    for k in x:
        torch.testing.assert_close(state["server"]["global_params"][f"model.{k}"], x[k], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(state["server"]["control"][f"model.{k}"], c[k], rtol=1e-4, atol=1e-5)
    assert state["clients"].keys() == c_clients.keys()
    for cid, ci in c_clients.items():
        for k in x:
            torch.testing.assert_close(state["clients"][cid]["c_i"][f"model.{k}"], ci[k], rtol=1e-4, atol=1e-5)


def test_fp16_loss_scaling_scales_the_correction_with_the_gradients(out, monkeypatch):
    """Under 16-mixed, grads stay multiplied by the loss scale until opt.step unscales them; an unscaled
    correction would all but vanish (the run would be close to FedAvg, ~15% away here, instead of ~1e-4)."""
    from lightning.fabric import Fabric
    from lightning.fabric.plugins.precision import MixedPrecision

    import fl.run.train

    extra = ("model.name=logistic", "trainer.rounds=3", "trainer.local_steps=3", "method.name=scaffold",
             "optim.momentum=0", "optim.lr=0.1")
    ref = ckpt(run(out, *extra, name="fp32"))["server"]

    def fp16_fabric(cfg, callbacks, loggers):  # Fabric turns 16-mixed into bf16 on CPU; force a real scaler
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
        return Fabric(accelerator="cpu", devices=1, callbacks=callbacks, loggers=loggers,
                      plugins=[MixedPrecision("16-mixed", "cpu", scaler)])

    monkeypatch.setattr(fl.run.train, "make_fabric", fp16_fabric)
    got = ckpt(run(out, *extra, name="fp16"))["server"]
    for part in ("global_params", "control"):
        for k, v in ref[part].items():
            assert float((got[part][k] - v).norm() / v.norm()) < 1e-2, (part, k)


def test_correction_changes_training_from_round_1_and_resume_is_exact(out):
    avg = read_metrics(run(out, "method.name=fedavg", "trainer.rounds=4", name="avg"))
    full = run(out, "method.name=scaffold", "trainer.rounds=4", name="full")
    sca = read_metrics(full)
    no_comm = lambda row: {k: v for k, v in row.items() if not k.startswith("comm/")}  # noqa: E731
    assert no_comm(avg[0]) == no_comm(sca[0])  # control variates are zero in round 0
    assert all(a["train/loss"] != s["train/loss"] for a, s in zip(avg[1:], sca[1:]))
    cut = run(out, "method.name=scaffold", "trainer.rounds=2", name="cut")
    assert ckpt(cut)["round"] == 1
    assert main([f"resume={cut}", "trainer.rounds=4"]) == 0
    assert read_metrics(cut) == sca
    a, b = ckpt(full), ckpt(cut)
    for part in ("global_params", "control"):
        assert all(torch.equal(a["server"][part][k], b["server"][part][k]) for k in a["server"][part])
    assert a["clients"].keys() == b["clients"].keys()
    for cid in a["clients"]:
        ca, cb = a["clients"][cid]["c_i"], b["clients"][cid]["c_i"]
        assert all(torch.equal(ca[k], cb[k]) for k in ca)


@on_one_and_two_processes("scaffold", "method.name=scaffold", "trainer.rounds=4", "data.num_clients=7",
                          "trainer.participation=0.6")
def scaffold_same_on_one_and_two_processes(one: Path, two: Path) -> None:
    a, b = read_metrics(one), read_metrics(two)
    assert len(a) == 4
    assert_same_rows(a, b, abs=1e-5)
    ca, cb = ckpt(one), ckpt(two)
    for part in ("global_params", "control"):
        for k, v in ca["server"][part].items():
            torch.testing.assert_close(cb["server"][part][k], v, rtol=0, atol=1e-5)
    assert ca["clients"].keys() == cb["clients"].keys()
    for cid, s in ca["clients"].items():
        for k, v in s["c_i"].items():
            torch.testing.assert_close(cb["clients"][cid]["c_i"][k], v, rtol=0, atol=1e-5)
