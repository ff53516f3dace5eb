"""FedMosaic and FedCT (Abourayya et al.): lambda, the vote, confidences, DP, the privacy contract, the
communication schedule, public labels never reaching a client, FedCT as an ablation, resume and 1 vs 2
processes, and the paper's models."""
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import fl.data
import fl.run.train
from fl.core import Split
from fl.methods.fedmosaic import CoTrainingServer, FedMosaicClient
from fl.methods.fedmosaic.vote import (
    adaptive_lambda,
    check_upload,
    class_frequencies,
    confidence_u,
    confidence_w,
    consensus,
    cotraining_loss,
    dp_noise,
    vote_scores,
)
from fl.run.train import main
from tests.helpers import load_ckpt as ckpt
from tests.helpers import read_metrics, run_tiny, tiny
from tests.helpers import same_private_states as same_clients
from tests.process_pairs import on_one_and_two_processes

# 6 clients x 3 rounds x 3 local steps, a public set of 40: seconds per run
MOSAIC = ["method.name=fedmosaic", "data.public_size=40", "trainer.local_steps=3", "trainer.participation=1.0",
          "optim.name=adam", "optim.lr=0.003"]


def run(out: Path, *extra: str, name: str) -> Path:
    return run_tiny(out, *MOSAIC, *extra, name=name, threads=None)


# ---- lambda ----------------------------------------------------------------------------------------
def test_lambda_values():
    t = torch.tensor
    assert adaptive_lambda(t(0.7), t(0.7)) == pytest.approx(1.0)
    assert adaptive_lambda(t(0.7), t(0.0)) == pytest.approx(math.e)
    assert adaptive_lambda(t(0.5), t(1.0)) == pytest.approx(math.exp(-1))
    g = torch.Generator().manual_seed(0)
    priv, pseudo = torch.rand(1000, generator=g) * 3 + 0.5, torch.rand(1000, generator=g) * 30
    lam = adaptive_lambda(priv, pseudo)
    assert bool((lam > 0).all()) and bool((lam <= math.e + 1e-6).all())
    # far apart losses underflow to 0.0 in float32 (the intended opt-out), never to NaN or a negative
    assert adaptive_lambda(t(1e-3), t(30.0)).item() == 0.0
    grid = torch.linspace(0, 5, 50)
    assert bool((adaptive_lambda(t(1.0), grid).diff() < 0).all())  # decreasing in l_pseudo
    assert bool((adaptive_lambda(grid[1:], t(1.0)).diff() > 0).all())  # increasing in l_priv
    assert math.isfinite(adaptive_lambda(t(0.0), t(0.3))) and adaptive_lambda(t(0.0), t(0.0)) == 1.0
    x = torch.tensor(0.4, requires_grad=True)
    assert adaptive_lambda(x, 2 * x).requires_grad is False


def test_lambda_is_a_constant_in_the_gradient():
    torch.manual_seed(0)
    lin = torch.nn.Linear(5, 3)
    x, y = torch.randn(8, 5), torch.randint(0, 3, (8,))
    xu, yu = torch.randn(6, 5), torch.randint(0, 3, (6,))
    loss, l_priv, l_pseudo, lam = cotraining_loss(lin(x), y, lin(xu), yu, adaptive_lambda)
    grads = torch.autograd.grad(loss, list(lin.parameters()))
    g_priv = torch.autograd.grad(F.cross_entropy(lin(x), y), list(lin.parameters()))
    g_pseudo = torch.autograd.grad(F.cross_entropy(lin(xu), yu), list(lin.parameters()))
    for g, gp, gu in zip(grads, g_priv, g_pseudo):
        torch.testing.assert_close(g, gp + lam * gu)
    # with the gradient through lambda the result differs: the detach matters
    undetached = lambda a, b: torch.exp(-(b - a) / a)  # noqa: E731
    loss2, *_ = cotraining_loss(lin(x), y, lin(xu), yu, undetached)
    g2 = torch.autograd.grad(loss2, list(lin.parameters()))
    assert not torch.allclose(g2[0], grads[0])
    # no consensus yet: the loss is l_priv alone
    loss0, _, l0, lam0 = cotraining_loss(lin(x), y, None, None, adaptive_lambda)
    assert l0 is None and lam0 is None and loss0.item() == pytest.approx(F.cross_entropy(lin(x), y).item())


# ---- the vote --------------------------------------------------------------------------------------
def test_vote_with_unit_confidence_is_the_majority_with_ties_to_the_lowest_class():
    g = torch.Generator().manual_seed(1)
    preds = [torch.randint(0, 4, (200,), generator=g) for _ in range(6)]
    labels = consensus(vote_scores(preds, [torch.ones(200)] * 6, 4))
    stacked = torch.stack(preds, 1)
    for j in range(200):
        counts = torch.bincount(stacked[j], minlength=4)
        assert labels[j] == min(c for c in range(4) if counts[c] == counts.max())
    tie = [torch.tensor([2, 1]), torch.tensor([1, 2]), torch.tensor([3, 0])]  # rows: {2,1,3} and {1,2,0}
    assert consensus(vote_scores(tie, [torch.ones(2)] * 3, 4)).tolist() == [1, 0]
    rand = [consensus(vote_scores(tie, [torch.ones(2)] * 3, 4), "random", torch.Generator().manual_seed(s))
            for s in range(20)]
    assert {r[0].item() for r in rand} == {1, 2, 3}  # a random tie-break picks among the tied only


def test_confidence_overrides_the_majority():
    preds = [torch.tensor([0]), torch.tensor([1]), torch.tensor([1])]
    assert consensus(vote_scores(preds, [torch.tensor([0.9]), torch.tensor([0.3]), torch.tensor([0.3])], 2)) == 0
    assert consensus(vote_scores(preds, [torch.tensor([0.5]), torch.tensor([0.3]), torch.tensor([0.3])], 2)) == 1


def test_vote_is_invariant_to_scale_and_client_order_and_matches_the_matrix_form():
    g = torch.Generator().manual_seed(2)
    preds = [torch.randint(0, 5, (300,), generator=g) for _ in range(7)]
    confs = [torch.rand(300, generator=g) + 1e-3 for _ in range(7)]
    s = vote_scores(preds, confs, 5)
    explicit = sum(torch.diag(e.double()) @ F.one_hot(p, 5).double() for p, e in zip(preds, confs))
    torch.testing.assert_close(s, explicit)
    labels = consensus(s)
    assert torch.equal(consensus(vote_scores(preds, [3.7 * e for e in confs], 5)), labels)
    perm = torch.randperm(7, generator=g).tolist()
    assert torch.equal(consensus(vote_scores([preds[i] for i in perm], [confs[i] for i in perm], 5)), labels)


# ---- confidences and DP ------------------------------------------------------------------------------
def test_confidence_w_is_the_frequency_of_the_predicted_class():
    freq = class_frequencies(torch.tensor([0, 0, 0, 2]), 4)
    assert freq.tolist() == [0.75, 0.0, 0.25, 0.0] and freq.sum() == 1
    e = confidence_w(torch.tensor([0, 1, 2, 3, 0]), freq, eps=1e-6)
    torch.testing.assert_close(e, torch.tensor([0.75, 1e-6, 0.25, 1e-6, 0.75]))


@pytest.mark.parametrize("score", ["norm_neg_entropy", "inv_entropy", "margin", "max_prob"])
def test_confidence_u_ranks_peaked_above_uniform(score):
    probs = torch.tensor([[0.97, 0.01, 0.01, 0.01], [0.6, 0.2, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]])
    e = confidence_u(probs, score, eps=1e-6)
    assert bool((e > 0).all()) and e[0] > e[1] > e[2]
    if score in ("norm_neg_entropy", "margin"):
        assert e[2].item() == pytest.approx(1e-6)  # the uniform softmax gets the floor
        assert bool((e <= 1).all())


def test_dp_noise_changes_only_e_and_keeps_it_positive():
    e = torch.rand(500, generator=torch.Generator().manual_seed(3))
    assert dp_noise(e, 0.0, torch.Generator()) is e
    for mech in ("gaussian", "laplace"):
        noisy = dp_noise(e, 0.5, torch.Generator().manual_seed(4), mech, clip=1.0, eps=1e-6)
        assert noisy.shape == e.shape and bool((noisy >= 1e-6).all()) and not torch.equal(noisy, e)
        again = dp_noise(e, 0.5, torch.Generator().manual_seed(4), mech, clip=1.0, eps=1e-6)
        assert torch.equal(noisy, again)  # seeded
    # E is clipped to [0, clip] before the noise
    big = dp_noise(torch.full((20000,), 50.0), 0.01, torch.Generator().manual_seed(5))
    assert big.mean().item() == pytest.approx(1.0, abs=0.01)


def test_payload_contract():
    ok = {"pred": torch.tensor([0, 2, 1], dtype=torch.uint8), "conf": torch.tensor([0.5, 1.0, 1e-6])}
    check_upload(ok, 3, 3, 0)
    bad = [
        {"pred": torch.softmax(torch.randn(3, 3), 1), "conf": ok["conf"]},  # soft labels: not allowed
        {"pred": torch.tensor([0, 3, 1]), "conf": ok["conf"]},  # class out of range
        {"pred": ok["pred"], "conf": torch.tensor([0.5, 0.0, 1.0])},  # not positive
        {"pred": ok["pred"], "conf": torch.tensor([0.5, float("nan"), 1.0])},
        {"pred": ok["pred"], "conf": torch.ones(3, 3)},  # one score per example
        {**ok, "logits": torch.randn(3, 3)},  # anything else
        {"pred": ok["pred"][:2], "conf": ok["conf"][:2]},  # every public example, in order
    ]
    for message in bad:
        with pytest.raises(ValueError):
            check_upload(message, 3, 3, 0)


# ---- runs --------------------------------------------------------------------------------------------
def test_schedule_pseudo_labels_and_metrics(out, monkeypatch):
    seen, sent = [], []
    train_step, server_step = FedMosaicClient.training_step, CoTrainingServer.server_step

    def record_step(self, batch, batch_idx):
        seen.append((self.round, self.cid, None if self.pseudo is None else self.pseudo.clone()))
        return train_step(self, batch, batch_idx)

    def record_server(self, ctx, mean, messages):
        assert mean == {}  # no parameters are shared
        for m in messages.values():  # what clients send: hard labels and one score per public example
            assert set(m) == {"pred", "conf"} and m["pred"].dtype == torch.uint8 and m["conf"].shape == (40,)
        server_step(self, ctx, mean, messages)
        sent.append(self.pseudo.clone().long())

    monkeypatch.setattr(FedMosaicClient, "training_step", record_step)
    monkeypatch.setattr(CoTrainingServer, "server_step", record_server)
    rows = read_metrics(run(out, "trainer.rounds=3", name="sched"))
    assert len(sent) == 3  # one communication per period of b = 3 local steps
    for rnd in range(3):
        steps = [(c, p) for r, c, p in seen if r == rnd]
        assert len(steps) == 6 * 3  # every client, b steps
        for _, p in steps:  # P is empty before the first consensus, then the previous period's L_t
            assert p is None if rnd == 0 else torch.equal(p.cpu(), sent[rnd - 1])
    assert "client/0/lambda" not in rows[0] and "client/0/loss_pseudo" not in rows[0]
    for key in ["client/3/lambda", "client/3/loss_priv", "client/3/loss_pseudo", "client/3/acc",
                "client/3/agree_with_consensus", "client/3/mean_E", "client/3/vote_share",
                "pseudo/acc_vs_hidden_truth", "pseudo/changed_frac", "test/acc_mean_clients", "test/acc_micro",
                "comm/bytes_up", "comm/bytes_down"]:
        assert key in rows[2], key
    assert 0 < rows[2]["client/3/lambda"] <= math.e
    assert rows[1]["comm/bytes_up"] == 6 * 40 * (1 + 4)  # uint8 labels + float32 scores, no parameters
    assert rows[0]["comm/bytes_down"] == 0 and rows[1]["comm/bytes_down"] == 6 * 40  # uint8 pseudo-labels
    assert rows[2]["pseudo/changed_frac"] == pytest.approx((sent[2] != sent[1]).double().mean().item())
    assert "test/acc_global_micro" not in rows[2]  # no global model


def test_public_labels_never_reach_a_client(out, monkeypatch):
    base = run(out, name="true_labels")
    build = fl.data.build_data

    def scrambled(cfg):
        data = build(cfg)
        data.public = Split(data.public.x, torch.randint(0, data.num_classes, data.public.y.shape,
                                                         generator=torch.Generator().manual_seed(9)))
        return data

    monkeypatch.setattr(fl.run.train, "build_data", scrambled)
    other = run(out, name="scrambled")
    a, b = read_metrics(base), read_metrics(other)
    for ra, rb in zip(a, b):  # the same training; only the server-side diagnostic changes
        assert {k: v for k, v in ra.items() if k != "pseudo/acc_vs_hidden_truth"} == \
               {k: v for k, v in rb.items() if k != "pseudo/acc_vs_hidden_truth"}
    assert any(ra["pseudo/acc_vs_hidden_truth"] != rb["pseudo/acc_vs_hidden_truth"] for ra, rb in zip(a, b))
    assert same_clients(ckpt(base)["clients"], ckpt(other)["clients"])


def test_fedct_is_fedmosaic_with_fixed_lambda_and_uniform_confidence(out):
    fedct = run(out, "method.name=fedct", name="fedct")
    ablation = run(out, "method.lambda_mode=fixed", "method.lambda_fixed=1.0", "method.confidence=uniform",
                   name="ablation")
    mosaic = run(out, name="mosaic")
    a, b = read_metrics(fedct), read_metrics(ablation)
    assert a == b and same_clients(ckpt(fedct)["clients"], ckpt(ablation)["clients"])
    assert all(r["client/2/lambda"] == 1.0 for r in a[1:]) and a[1]["client/2/mean_E"] == 1.0
    assert read_metrics(mosaic)[2]["train/loss"] != a[2]["train/loss"]


def test_dp_with_sigma_zero_is_fedmosaic_and_noise_changes_only_the_scores(out):
    plain = read_metrics(run(out, "method.confidence=U", name="plain"))
    zero = read_metrics(run(out, "method.confidence=U", "method.dp=true", "method.dp_sigma=0.0", name="zero"))
    assert plain == zero
    noisy = read_metrics(run(out, "method.confidence=U", "method.dp=true", "method.dp_sigma=0.5",
                             "trainer.rounds=1", name="noisy"))
    # round 0 trains without pseudo-labels: the same models and predictions, other scores
    assert noisy[0]["train/loss"] == plain[0]["train/loss"]
    assert noisy[0]["client/1/agree_with_consensus"] != plain[0]["client/1/agree_with_consensus"] or \
        noisy[0]["client/1/mean_E"] != plain[0]["client/1/mean_E"]


@pytest.mark.parametrize("extra", [(), ("method.lambda_estimation=round", "method.confidence=U")])
def test_resume_continues_the_same_run(out, extra):
    extra = ("trainer.evaluators=[]", *extra)  # some evaluators run on the last round only
    full = run(out, "trainer.rounds=4", *extra, name="full")
    assert main(tiny(out, *MOSAIC, "trainer.rounds=2", *extra, "logger.run_name=part")) == 0
    part = out / "outputs" / "part"
    assert main([f"resume={part}", "trainer.rounds=4", "logger.wandb.mode=disabled", "logger.progress=false"]) == 0
    assert read_metrics(full) == read_metrics(part)
    cf, cp = ckpt(full), ckpt(part)
    assert torch.equal(cf["server"]["pseudo"], cp["server"]["pseudo"]) and same_clients(cf["clients"], cp["clients"])
    assert all(s["optimizer"]["state"] for s in cf["clients"].values())  # Adam moments kept per client


@on_one_and_two_processes("fedmosaic_pseudo_labels", *MOSAIC, "trainer.rounds=3", "data.num_clients=5",
                          "model.norm=batch", "method.tie_break=random")
def same_pseudo_labels_on_one_and_two_processes(one: Path, two: Path) -> None:
    a, b = read_metrics(one), read_metrics(two)
    assert a == b
    ca, cb = ckpt(one), ckpt(two)
    assert torch.equal(ca["server"]["pseudo"], cb["server"]["pseudo"]) and same_clients(ca["clients"], cb["clients"])


def test_clients_start_from_independent_initialisations(out):
    d = run(out, "trainer.rounds=1", "optim.lr=1e-12", name="init")  # Adam steps of ~1e-12: the init
    states = ckpt(d)["clients"]
    w = [states[c]["private"]["model.head.weight"] for c in range(3)]
    assert not torch.allclose(w[0], w[1], atol=1e-4) and not torch.allclose(w[1], w[2], atol=1e-4)
    shared = ckpt(run(out, "trainer.rounds=1", "optim.lr=1e-12", "method.init=shared", name="shared"))["clients"]
    torch.testing.assert_close(shared[0]["private"]["model.head.weight"], shared[1]["private"]["model.head.weight"],
                               atol=1e-6, rtol=0)


def test_config_errors(out, capsys):
    assert main(tiny(out, "method.name=fedmosaic")) == 2  # no public set
    assert "data.public_size" in capsys.readouterr().err
    assert main(tiny(out, *MOSAIC, "method.confidence=X")) == 2
    assert "method.confidence='X' is not valid" in capsys.readouterr().err
    assert main(["conf=fedmosaic_domainnet", f"data.root={out / 'nodata'}", "logger.wandb.mode=disabled"]) == 2
    err = capsys.readouterr().err
    assert "domainnet" in err and "conf=fedmosaic_domainnet_synthetic" in err
    assert not (out / "outputs").exists()


# ---- models ------------------------------------------------------------------------------------------
def test_paper_models():
    from omegaconf import OmegaConf

    from fl.core import build_model

    def model(name, shape, width=32):
        cfg = OmegaConf.create({"model": {"name": name, "width": width, "norm": "none"}})
        return build_model(cfg, shape, 10).eval()

    alex = model("alexnet_bn", (3, 256, 256))
    assert 55e6 < sum(p.numel() for p in alex.parameters()) < 60e6  # FedBN's AlexNet, about 57M
    assert alex(torch.zeros(2, 3, 256, 256)).shape == (2, 10)
    assert model("fedct_cnn", (3, 32, 32))(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert model("vit_mini", (3, 32, 32), width=8)(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    vit = model("vit_s16", (3, 224, 224))
    assert 21e6 < sum(p.numel() for p in vit.parameters()) < 23e6  # ViT-S/16: about 22M
    mlp = model("mlp", (1, 28, 28), width=128)  # FedCT's FMNIST MLP 784-512-512-10
    assert [m.out_features for m in mlp.modules() if isinstance(m, torch.nn.Linear)] == [512, 512, 10]


CONFS = [f"fedmosaic_{s}{t}" for s in ("domainnet", "office", "domainnet_fs", "office_fs", "cifar10", "fmnist")
         for t in ("", "_synthetic")]


@pytest.mark.parametrize("conf", CONFS)
def test_configs_load(conf):
    from fl.config import load_config

    cfg = load_config([f"conf={conf}"])
    assert cfg.method.name == "fedmosaic" and cfg.data.public_size > 0 and cfg.trainer.local_steps >= 1
    assert (cfg.data.name in ("embedded", "embedded_domains")) == conf.endswith("_synthetic")
    assert load_config([f"conf={conf}", "method.name=fedct"]).method.name == "fedct"


def test_a_client_with_flipped_labels_stops_listening(out, monkeypatch):
    """Lambda weights collaboration by agreement (FedMosaic Sec. 3): with client 0's labels flipped
    (y -> C-1-y), its pseudo-label loss stays far above its private loss, so its lambda falls well below the
    clean clients'."""
    build = fl.data.build_data

    def flipped(cfg):
        data = build(cfg)
        c0 = data.clients[0]
        c0.train = Split(c0.train.x, data.num_classes - 1 - c0.train.y, c0.train.domain)
        return data

    monkeypatch.setattr(fl.run.train, "build_data", flipped)
    rows = read_metrics(run(out, "data.num_clients=5", "data.partition.name=iid", "data.embedded.samples_per_class=100",
                            "data.embedded.noise=0.3", "model.width=16", "trainer.rounds=5", "trainer.local_steps=15",
                            "trainer.evaluators=[]", "trainer.eval_every=5", name="flip"))
    late = rows[2:]
    lam = [sum(r[f"client/{c}/lambda"] for r in late) / len(late) for c in range(5)]
    assert lam[0] < 0.25 * min(lam[1:]), lam


def test_first_vote_after_delays_the_first_consensus_and_clients_send_nothing_before_it(out, monkeypatch):
    """method.first_vote_after=6 with b = 3 steps: no vote after the first period (nothing sent, no pseudo-labels
    in round 1), the first consensus after the second; pseudo/majority_class_share is the largest class's share."""
    seen = []
    train_step = FedMosaicClient.training_step

    def record_step(self, batch, batch_idx):
        seen.append((self.round, self.pseudo is not None))
        return train_step(self, batch, batch_idx)

    monkeypatch.setattr(FedMosaicClient, "training_step", record_step)
    rows = read_metrics(run(out, "trainer.rounds=3", "method.first_vote_after=6", name="late"))
    assert rows[0]["comm/bytes_up"] == 0 and rows[1]["comm/bytes_up"] == 6 * 40 * (1 + 4)
    assert "pseudo/acc_vs_hidden_truth" not in rows[0] and "pseudo/majority_class_share" in rows[1]
    assert {p for r, p in seen if r <= 1} == {False} and {p for r, p in seen if r == 2} == {True}
    state = ckpt(out / "outputs" / "late")["server"]
    share = float(torch.bincount(state["pseudo"].long()).max()) / len(state["pseudo"])
    assert rows[2]["pseudo/majority_class_share"] == pytest.approx(share)


def test_a_collapsed_consensus_is_warned_about(out):
    """Every client voting one class for all of U: the consensus holds one class, and the run says so."""
    from fl.config import load_config
    from fl.core import make_client_module
    from fl.core.context import RoundContext
    from fl.data import build_data
    from fl.run.train import make_fabric

    cfg = load_config(tiny(out, "method.name=fedmosaic", "data.public_size=30", "trainer.local_steps=3"))
    fabric = make_fabric(cfg, [], [])
    module, data = make_client_module(cfg, fabric, build_data(cfg))
    server = CoTrainingServer(cfg)
    server.setup(module, data)
    n = len(data.public)
    messages = {c: {"pred": torch.full((n,), 2, dtype=torch.uint8), "conf": torch.ones(n)} for c in range(3)}
    with pytest.warns(UserWarning, match="consensus collapsed"):
        server.server_step(RoundContext(0, fabric, data, cfg), {}, messages)
    assert server.diagnostics["pseudo/majority_class_share"] == 1.0 and set(server.pseudo.tolist()) == {2}
