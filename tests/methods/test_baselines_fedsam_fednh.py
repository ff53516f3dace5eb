"""FedSAM (fl/methods/fedsam.py) and FedNH (fl/methods/fednh.py): FedSAM with rho = 0 is FedAvg exactly and its
step matches SAM written by hand; FedSAM-FT is FedSAM plus the fine-tuning protocol; FedNH's server prototype update
by hand on fabricated messages and end to end, unit-norm and seeded prototypes, resume (their configs:
tests/config/test_baseline_configs.py)."""
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from fl.config import load_config
from fl.core import batch_indices, generator, sample_clients
from fl.data import build_data
from fl.methods.fednh import PROTOTYPES, FedNHClient, FedNHServer, init_prototypes, update_prototypes
from tests.helpers import (
    global_params,
    initial_model,
    interrupted_and_resumed,
    load_ckpt,
    read_metrics,
    record_uploads,
    run_tiny,
    tiny,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # hand computations reduce in the same order as the runs (fabric.cpu_threads=1)


def rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl without the wall times."""
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in read_metrics(run_dir)]


# ---- FedSAM --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", [["model.norm=batch"], ["model.name=fedct_cnn", "trainer.drop_last=true"]],
                         ids=["cnn_batchnorm", "bn_and_dropout"])
def test_fedsam_with_rho_0_is_fedavg_exactly(out, model):
    """eps = 0: the second pass sees the same weights, batch, dropout draws and BatchNorm statistics, so every step,
    the global model (running statistics and num_batches_tracked included) and every FedAvg metric are FedAvg's."""
    extra = ("trainer.rounds=2", "optim.momentum=0.9", "trainer.local_steps=3", *model)
    avg = run_tiny(out, "method.name=fedavg", *extra, name="avg")
    sam = run_tiny(out, "method.name=fedsam", "method.rho=0", *extra, name="sam")
    ga, gs = global_params(avg), global_params(sam)
    assert ga.keys() == gs.keys() and all(torch.equal(ga[k], gs[k]) for k in ga)
    assert any("running_mean" in k for k in ga) and any("num_batches_tracked" in k for k in ga)
    ra, rs = rows(avg), rows(sam)
    assert len(ra) == 2 and [{k: r[k] for k in a} for a, r in zip(ra, rs)] == ra
    assert all(r["train/sam_loss"] == r["train/loss"] for r in rs)  # no perturbation: the same loss twice


def test_fedsam_steps_match_sam_by_hand(out):
    """One client (participation 0.1 of 6), 3 local steps of plain SGD: g = grad L_B(w), eps = rho g / ||g|| over all
    parameters, w <- w - lr grad L_B(w + eps); the global model is that client's model."""
    extra = ("method.name=fedsam", "method.rho=0.5", "trainer.rounds=1", "trainer.participation=0.1",
             "trainer.local_steps=3", "optim.momentum=0", "optim.lr=0.1")
    got = global_params(run_tiny(out, *extra, name="sam"))
    cfg = load_config(tiny(out, *extra))
    data = build_data(cfg)
    model = initial_model(cfg, data)
    (cid,) = sample_clients(cfg.seed, 0, data.num_clients, cfg.trainer.participation)
    train = data.clients[cid].train
    params = list(model.parameters())
    for _, idx in batch_indices(len(train), cfg.trainer.batch_size, generator(cfg.seed, 0, cid, "train"), steps=3):
        if idx is None:
            continue
        x, y = data.prepare(train.x[idx]), train.y[idx]
        g = torch.autograd.grad(F.cross_entropy(model(x), y), params)
        norm = math.sqrt(sum(float((gi ** 2).sum()) for gi in g))
        w = [p.detach().clone() for p in params]
        with torch.no_grad():
            for p, gi in zip(params, g):
                p += 0.5 * gi / norm
        g_sam = torch.autograd.grad(F.cross_entropy(model(x), y), params)
        with torch.no_grad():
            for p, wi, gi in zip(params, w, g_sam):
                p.copy_(wi - 0.1 * gi)
    plain = initial_model(cfg, data).state_dict()
    moved = 0.0
    for k, v in model.state_dict().items():
        torch.testing.assert_close(got["model." + k], v, rtol=1e-5, atol=1e-6)
        moved = max(moved, float((v - plain[k]).abs().max()))
    assert moved > 1e-3


def test_fedsam_ft_is_fedsam_then_the_fine_tuning_rounds(out):
    """finetune.after_round=1: round 0 is FedSAM, round 1 fine-tunes each client locally with plain cross-entropy
    (no sam_loss logged, nothing uploaded) and leaves the global model at FedSAM's."""
    common = ("method.name=fedsam", "trainer.participation=1.0", "trainer.local_steps=2", "trainer.checkpoint_every=0")
    sam = run_tiny(out, *common, "trainer.rounds=1", name="sam")
    ft = run_tiny(out, *common, "trainer.rounds=2", "finetune.after_round=1", "trainer.last_k=1", name="ft")
    g, gft = global_params(sam), global_params(ft)
    assert all(torch.equal(g[k], gft[k]) for k in g)
    first, last = rows(ft)
    assert "train/sam_loss" in first and "train/sam_loss" not in last and last["comm/bytes_up"] == 0.0
    clients = load_ckpt(ft)["clients"]
    assert len(clients) == 6
    assert all(not torch.equal(s["private"][k], g[k]) for s in clients.values() for k in ["model.head.weight"])


@pytest.mark.parametrize("sweep", ["feddrm_ft_baselines_synthetic", "feddrm_ft_baselines_real"])
def test_feddrm_ft_sweeps_run_fedsam_ft_with_its_default_rho(sweep):
    spec = yaml.safe_load((ROOT / "sweeps" / f"{sweep}.yaml").read_text())
    params = spec["parameters"]
    arm = next(a for a in params["arm"]["values"] if "method.name=fedsam" in params[f"arms.{a}"]["value"].split())
    fixed = [a for a in spec["command"] if "=" in str(a)]
    cfg = load_config([*fixed, f"arm={arm}", f"arms.{arm}={params[f'arms.{arm}']['value']}"])  # as W&B's agent does
    assert cfg.method.name == "fedsam"
    assert cfg.method.rho == 0.05 and cfg.finetune.after_round is not None
    assert cfg.finetune.after_round < cfg.trainer.rounds


# ---- FedNH ---------------------------------------------------------------------------------------------------------
def fednh_server(*extra) -> FedNHServer:
    server = FedNHServer(load_config(["method.name=fednh", *extra]))
    return server


def test_fednh_server_update_by_hand():
    """Four classes in 2-d, rho = 0.5, two clients. Class 0: both clients, equal counts, means at 90 and 0 degrees
    -> Pbar at 45 degrees, smoothed with P_0 at 0 degrees -> 22.5 degrees. Class 1: counts 3 and 1 weight the means.
    Class 2: one client. Class 3: no client has it, so it stays. The backbone is the plain mean."""
    s = 1 / math.sqrt(2)
    P = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]])
    a = {"counts": torch.tensor([2.0, 3.0, 1.0, 0.0]),
         "prototypes": torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])}
    b = {"counts": torch.tensor([2.0, 1.0, 0.0, 0.0]),
         "prototypes": torch.tensor([[1.0, 0.0], [-s, s], [0.0, 0.0], [0.0, 0.0]])}
    server = fednh_server("method.rho=0.5")
    server.global_params = {PROTOTYPES: P.clone(), "model.backbone.0.weight": torch.zeros(3)}
    server.server_step(None, {"model.backbone.0.weight": torch.ones(3)}, {4: b, 1: a})
    new = server.global_params[PROTOTYPES]
    pbar1 = torch.tensor([3.0 - s, s]) / 4
    pbar1 = pbar1 / pbar1.norm()
    p1 = 0.5 * torch.tensor([0.0, 1.0]) + 0.5 * pbar1
    expected = torch.stack([torch.tensor([math.cos(math.pi / 8), math.sin(math.pi / 8)]), p1 / p1.norm(),
                            torch.tensor([-s, s]), torch.tensor([0.0, -1.0])])
    torch.testing.assert_close(new, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(new.norm(dim=1), torch.ones(4), rtol=0, atol=1e-6)
    assert torch.equal(server.global_params["model.backbone.0.weight"], torch.ones(3))
    assert torch.equal(update_prototypes(P, [a, b], rho=1.0), P)  # rho = 1: fixed prototypes (FedUH)


@pytest.mark.parametrize("kind", ["orthogonal", "random"])
@pytest.mark.parametrize("width", [4, 2])  # 16-d features for 10 classes, then 8-d: more classes than dimensions
def test_fednh_initial_prototypes_are_seeded_unit_vectors(out, kind, width):
    def prototypes(seed: int) -> torch.Tensor:
        cfg = load_config(tiny(out, "method.name=fednh", f"method.prototype_init={kind}", f"model.width={width}",
                               f"seed={seed}"))
        return FedNHClient(cfg, build_data(cfg)).model.head.prototypes

    P = prototypes(0)
    assert P.shape == (10, 4 * width)
    assert torch.equal(P, prototypes(0)) and not torch.equal(P, prototypes(1))
    expected = init_prototypes(10, 4 * width, generator(0, 0, -1, "fednh/prototypes"), kind).float()
    assert torch.equal(P, expected)  # the framework's seeding, independent of the model's initialisation
    torch.testing.assert_close(P.norm(dim=1), torch.ones(10), rtol=0, atol=1e-6)
    if kind == "orthogonal" and width == 4:
        torch.testing.assert_close(P @ P.T, torch.eye(10), rtol=0, atol=1e-6)


def test_fednh_round_updates_prototypes_from_the_trained_clients_class_means(out):
    """One client trains (participation 0.1): the new backbone is its model, and the new prototypes are P0 smoothed
    towards the normalised class means of its normalised features, computed here from the checkpoint."""
    extra = ("method.name=fednh", "method.rho=0.6", "trainer.rounds=1", "trainer.participation=0.1",
             "trainer.local_steps=3")
    run = run_tiny(out, *extra, name="nh")
    got = global_params(run)
    cfg = load_config(tiny(out, *extra))
    data = build_data(cfg)
    (cid,) = sample_clients(cfg.seed, 0, data.num_clients, cfg.trainer.participation)
    model = initial_model(cfg, data).eval()
    model.backbone.load_state_dict({k.removeprefix("model.backbone."): v for k, v in got.items()
                                    if k.startswith("model.backbone.")})
    train = data.clients[cid].train
    with torch.no_grad():
        z = F.normalize(model.backbone(data.prepare(train.x)), dim=1)
    P0 = init_prototypes(10, 16, generator(cfg.seed, 0, -1, "fednh/prototypes")).float()
    expected = P0.clone()
    for c in train.y.unique():
        mu = F.normalize(z[train.y == c].mean(0), dim=0)
        expected[c] = F.normalize(0.6 * P0[c] + 0.4 * mu, dim=0)
    assert len(train.y.unique()) < 10  # some classes are absent and keep P0
    torch.testing.assert_close(got[PROTOTYPES], expected, rtol=0, atol=1e-5)
    assert float(got["model.head.s"]) != 1.0  # s is learned (the authors' code)
    shared = sum(v.numel() for k, v in got.items() if k != PROTOTYPES)
    assert rows(run)[0]["comm/bytes_up"] == 4 * (shared + 10 * 16 + 10)  # the model less P, then (mu_k, n_k)


def test_fednh_prototypes_stay_unit_norm_and_resume_equals_uninterrupted(out, monkeypatch):
    """Interrupted (Ctrl-C) in round 2 of 4, then resumed: the same metrics and the same global model, prototypes
    included (they are part of the server's state_dict)."""
    extra = ("method.name=fednh", "trainer.rounds=4", "trainer.checkpoint_every=10", "method.rho=0.5")
    full, cut = interrupted_and_resumed(out, monkeypatch, *extra)
    assert rows(cut) == rows(full)
    a, b = global_params(full), global_params(cut)
    assert a.keys() == b.keys() and PROTOTYPES in a and all(torch.equal(a[k], b[k]) for k in a)
    torch.testing.assert_close(a[PROTOTYPES].norm(dim=1), torch.ones(10), rtol=0, atol=1e-6)
    P0 = init_prototypes(10, 16, generator(0, 0, -1, "fednh/prototypes")).float()
    assert not torch.allclose(a[PROTOTYPES], P0)  # the server moved them


def test_fednh_uploads_neither_the_prototypes_nor_a_fixed_scale(out, monkeypatch):
    seen = record_uploads(monkeypatch, FedNHClient)
    run = run_tiny(out, "method.name=fednh", "method.learn_s=false", "method.s=10", "trainer.rounds=2", name="fixed")
    g = global_params(run)
    assert seen and all(PROTOTYPES not in params and "model.head.s" not in params for _, _, params, _ in seen)
    assert {k for k in g if k.startswith("model.head.")} == {PROTOTYPES, "model.head.s"}
    assert float(g["model.head.s"]) == 10.0


def test_baseline_configs_hold_the_chosen_values():
    sam = load_config(["conf=fedsam_cifar10_dir03"])
    assert sam.method.rho == 0.05 and sam.model.proj_dim == 256
    nh = load_config(["conf=fednh_cifar100_dir01"])
    assert (nh.method.rho, nh.method.s, nh.method.learn_s) == (0.9, 1.0, True) and nh.data.num_clients == 20
