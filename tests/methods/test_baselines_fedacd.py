"""FedNova, FedLC, FedNTD and FedDecorr (fl/methods/fednova.py, fedlc.py, fedntd.py, feddecorr.py), FedACD's
baselines: each one's defining property (FedNova with equal local steps is FedAvg, and its normalised step in closed
form with unequal ones; FedLC on a uniform label mix is FedAvg; FedNTD and FedDecorr with beta = 0 are FedAvg
bitwise) and their losses by hand (their configs: tests/config/test_baseline_configs.py).
None of the four keeps state beyond FedAvg's (the global model): the checkpoints are checked to hold nothing else."""
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from fl.config import ConfigError, load_config
from fl.core import batch_indices, generator
from fl.data import build_data
from fl.methods.fedavg import FedAvgClient
from fl.methods.feddecorr import decorr_loss
from fl.methods.fedlc import calibrated_loss
from fl.methods.fednova import normaliser
from fl.methods.fedntd import FedNTDClient, ntd_loss
from fl.run.train import main
from tests.helpers import global_params, initial_model, load_ckpt, read_metrics, record_uploads, run_tiny, tiny

METHODS = ("fednova", "fedlc", "fedntd", "feddecorr")
# FedAvg-exactness on a BatchNorm model, and on one with dropout (FedCT's CNN)
MODELS = pytest.mark.parametrize("model", [["model.norm=batch"], ["model.name=fedct_cnn", "trainer.drop_last=true"]],
                                 ids=["cnn_batchnorm", "bn_and_dropout"])


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)  # hand computations reduce in the same order as the runs (fabric.cpu_threads=1)


def assert_fedavg_rows(avg: Path, other: Path) -> None:
    """Every FedAvg metric of every round is the same in `other` (which may log more)."""
    ra, ro = read_metrics(avg), read_metrics(other)
    assert len(ra) == len(ro) and [{k: r[k] for k in a} for a, r in zip(ra, ro)] == ra


def assert_no_state_beyond_fedavg(run_dir: Path) -> None:
    """The server keeps only the global model and the clients nothing of their own: resume is FedAvg's."""
    ckpt = load_ckpt(run_dir)
    assert set(ckpt["server"]) == {"global_params"}
    assert all(set(s) == {"private"} and not s["private"] for s in ckpt["clients"].values())


def assert_params_close(a: dict, b: dict, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if a[k].is_floating_point():
            torch.testing.assert_close(a[k], b[k], rtol=rtol, atol=atol, msg=k)
        else:
            assert torch.equal(a[k], b[k]), k


def max_diff(a: dict, b: dict) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].is_floating_point())


# ---- FedNova -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("steps, rho", [(0, 0.9), (1, 0.0), (1, 0.9), (7, 0.0), (7, 0.5), (40, 0.9)])
def test_fednova_normaliser_is_how_far_torch_sgd_moves_under_a_unit_gradient(steps, rho):
    """||a_i||_1 = sum_k (1 - rho^k) / (1 - rho): the displacement / lr of torch's SGD (momentum rho, fresh buffer)
    after `steps` steps of gradient 1."""
    p = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([p], lr=0.1, momentum=rho)
    for _ in range(steps):
        p.grad = torch.ones_like(p)
        opt.step()
    assert normaliser(steps, rho) == pytest.approx(-float(p) / 0.1, rel=1e-12, abs=1e-12)
    if rho == 0:
        assert normaliser(steps, rho) == steps


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_fednova_with_equal_local_steps_is_fedavg(out, momentum):
    """Every client takes 3 steps: every ||a_i||_1 and tau_eff are equal, x - tau_eff sum p_i (x - y_i) / ||a_i||_1
    is sum p_i y_i (to float rounding), BatchNorm statistics included."""
    extra = ("trainer.rounds=2", "trainer.local_steps=3", f"optim.momentum={momentum}", "model.norm=batch")
    avg = run_tiny(out, "method.name=fedavg", *extra, name="avg")
    nova = run_tiny(out, "method.name=fednova", *extra, name="nova")
    assert_params_close(global_params(nova), global_params(avg))
    ra, rn = read_metrics(avg), read_metrics(nova)
    for a, n in zip(ra, rn):
        assert n["train/loss"] == pytest.approx(a["train/loss"], abs=1e-6)
        assert n["test/acc_global_micro"] == pytest.approx(a["test/acc_global_micro"], abs=1e-6)
        assert n["server/tau_min"] == n["server/tau_max"] == 3
        assert n["server/tau_eff"] == pytest.approx(normaliser(3, momentum))
    assert_no_state_beyond_fedavg(nova)


def test_fednova_normalises_unequal_local_steps_in_closed_form(out, monkeypatch):
    """Two local epochs on clients of different sizes (tau_i = 2 ceil(n_i / B)), momentum 0.9: one round of FedNova
    is x - tau_eff sum_i p_i (x - y_i) / ||a_i||_1 with the y_i FedAvg's clients train (round 0 trains the same),
    p_i = n_i / sum n_j and tau_eff = sum_i p_i ||a_i||_1; FedAvg's sum_i p_i y_i is measurably elsewhere."""
    extra = ("trainer.rounds=1", "trainer.local_epochs=2", "optim.momentum=0.9")
    uploads = record_uploads(monkeypatch, FedAvgClient)
    avg = global_params(run_tiny(out, "method.name=fedavg", *extra, name="avg"))
    nova = global_params(run_tiny(out, "method.name=fednova", *extra, name="nova"))
    cfg = load_config(tiny(out, *extra))
    data = build_data(cfg)
    x = {f"model.{k}": v.double() for k, v in initial_model(cfg, data).state_dict().items()}
    total, tau_eff, direction, taus = 0.0, 0.0, {k: torch.zeros_like(v) for k, v in x.items()}, []
    for rnd, cid, y, n in uploads:
        assert rnd == 0
        gen = generator(cfg.seed, 0, cid, "train")
        steps = sum(idx is not None for _, idx in batch_indices(len(data.clients[cid].train), cfg.trainer.batch_size,
                                                                gen, epochs=2, drop_last=cfg.trainer.drop_last))
        a = sum((1 - 0.9 ** k) / (1 - 0.9) for k in range(1, steps + 1))  # ||a_i||_1, term by term
        taus.append(steps)
        total += n
        tau_eff += n * a
        for k in x:
            direction[k] += n * (x[k] - y[k].double()) / a
    assert len(set(taus)) > 1, taus  # the clients' local steps differ
    expected = {k: (x[k] - (tau_eff / total) * direction[k] / total).float() for k in x}
    assert_params_close(nova, expected)
    assert max_diff(nova, avg) > 1e-3


def test_fednova_refuses_optimizers_without_a_normaliser(out):
    with pytest.raises(ConfigError, match="optim.name=sgd"):
        load_config(tiny(out, "method.name=fednova", "optim.name=adam"))


# ---- FedLC ---------------------------------------------------------------------------------------------------------
def test_fedlc_loss_by_hand():
    """-log softmax(z - tau n^{-1/4})_y over the classes the client holds; a class it lacks drops out of the softmax
    and its logit gets no gradient; with equal counts the shift is a constant and the loss is cross-entropy."""
    z = torch.tensor([[2.0, 0.5, -1.0, 0.3], [0.1, -0.4, 3.0, 1.2]], requires_grad=True)
    y = torch.tensor([0, 3])
    counts, tau = torch.tensor([16, 1, 0, 81]), 0.7
    shift = {0: tau * 16 ** -0.25, 1: tau * 1.0, 3: tau * 81 ** -0.25}
    expected = 0.0
    for row, label in zip(z.tolist(), y.tolist()):
        s = {c: row[c] - shift[c] for c in shift}
        expected -= s[label] - torch.logsumexp(torch.tensor(list(s.values())), 0).item()
    loss = calibrated_loss(z, y, counts, tau)
    assert float(loss) == pytest.approx(expected / 2, rel=1e-6)
    loss.backward()
    assert torch.all(z.grad[:, 2] == 0) and torch.all(z.grad[:, [0, 1, 3]] != 0)
    uniform = torch.full((4,), 16)
    assert float(calibrated_loss(z, y, uniform, tau)) == pytest.approx(float(F.cross_entropy(z, y)), rel=1e-6)


def test_fedlc_with_a_uniform_local_label_mix_is_fedavg(out):
    """Two clients holding all 10 classes, 16 images each: the calibration shifts every logit by tau 16^{-1/4},
    so training is FedAvg's (to float rounding)."""
    extra = ("trainer.rounds=2", "data.test_split=official", "data.num_clients=2", "data.partition.name=classes",
             "data.partition.classes_per_client=10", "trainer.participation=1.0")
    data = build_data(load_config(tiny(out, "method.name=fedlc", *extra)))
    counts = [torch.bincount(c.train.y, minlength=data.num_classes) for c in data.clients]
    assert all(torch.all(c == c[0]) and c[0] > 0 for c in counts), counts
    avg = run_tiny(out, "method.name=fedavg", *extra, name="avg")
    lc = run_tiny(out, "method.name=fedlc", "method.tau=1.0", *extra, name="lc")
    assert_params_close(global_params(lc), global_params(avg))
    for a, b in zip(read_metrics(avg), read_metrics(lc)):
        assert b["train/loss"] == pytest.approx(a["train/loss"], abs=1e-5)
        assert b["train/ce"] == pytest.approx(a["train/loss"], abs=1e-5)
        assert b["test/acc_global_micro"] == pytest.approx(a["test/acc_global_micro"], abs=1e-6)
    assert_no_state_beyond_fedavg(lc)


def test_fedlc_calibrates_skewed_clients(out):
    """On the Dirichlet split the margins differ per class: the run leaves FedAvg's path from round 0."""
    avg = run_tiny(out, "method.name=fedavg", "trainer.rounds=1", name="avg")
    lc = run_tiny(out, "method.name=fedlc", "trainer.rounds=1", name="lc")
    assert max_diff(global_params(lc), global_params(avg)) > 1e-3
    (row,) = read_metrics(lc)
    assert row["train/loss"] != row["train/ce"]


# ---- FedNTD --------------------------------------------------------------------------------------------------------
def test_ntd_loss_by_hand():
    """KL(q~_g || q~_l) over the not-true classes at temperature tau, batch mean; blind to the true-class logit."""
    local = torch.tensor([[1.0, 2.0, -0.5, 0.0], [0.3, -1.0, 0.8, 2.2]], requires_grad=True)
    glob = torch.tensor([[0.5, 1.0, 1.5, -1.0], [2.0, 0.0, -0.7, 0.4]])
    y, tau = torch.tensor([1, 3]), 2.0
    expected = 0.0
    for zl, zg, label in zip(local.tolist(), glob.tolist(), y.tolist()):
        rest = [c for c in range(4) if c != label]
        ql = torch.softmax(torch.tensor([zl[c] / tau for c in rest]), 0)
        qg = torch.softmax(torch.tensor([zg[c] / tau for c in rest]), 0)
        expected += float((qg * (qg.log() - ql.log())).sum())
    loss = ntd_loss(local, glob, y, tau)
    assert float(loss) == pytest.approx(expected / 2, rel=1e-6)
    loss.backward()
    assert local.grad[0, 1] == 0 and local.grad[1, 3] == 0  # the true class takes no part
    moved = local.detach().clone()
    moved[0, 1] += 5.0
    assert float(ntd_loss(moved, glob, y, tau)) == pytest.approx(float(loss), rel=1e-6)
    assert float(ntd_loss(glob, glob, y, tau)) == 0.0


@pytest.mark.parametrize("tau_squared", [True, False])
def test_fedntd_step_is_the_released_loss_by_hand(out, monkeypatch, tau_squared):
    """tau = 3, beta = 0.5: each round-0 client's second step minimises CE + beta tau^2 (1/B) sum_b sum_{c != y_b}
    q~_g(c) log(q~_g(c) / q~_l(c)), the authors' released loss (Lee-Gihun/FedNTD criterion.py), written out on the
    step's batch with the frozen global model = the initial model; tau_squared=false drops the factor 9."""
    extra = ("method.name=fedntd", "method.tau=3", "method.beta=0.5", f"method.tau_squared={tau_squared}",
             "trainer.rounds=1", "trainer.local_steps=2")
    seen = []
    original = FedNTDClient.training_step

    def step(self, batch, batch_idx):
        with torch.no_grad():
            local = self.model(batch[0]).double()
        result = original(self, batch, batch_idx)
        if batch_idx == 1:
            seen.append((batch[0].clone(), batch[1].clone(), local, float(result["loss"].detach())))
        return result

    monkeypatch.setattr(FedNTDClient, "training_step", step)
    run_tiny(out, *extra, name="ntd")
    cfg = load_config(tiny(out, *extra))
    glob_model = initial_model(cfg, build_data(cfg)).eval()
    assert len(seen) == 3  # the round's clients
    for x, y, local, loss in seen:
        with torch.no_grad():
            glob = glob_model(x).double()
        ce = -(local[range(len(y)), y] - local.logsumexp(1)).mean()
        kl = 0.0
        for zl, zg, label in zip(local, glob, y.tolist()):
            rest = [c for c in range(len(zl)) if c != label]
            log_ql = zl[rest] / 3 - (zl[rest] / 3).logsumexp(0)
            log_qg = zg[rest] / 3 - (zg[rest] / 3).logsumexp(0)
            kl += float((log_qg.exp() * (log_qg - log_ql)).sum())
        factor = 9.0 if tau_squared else 1.0
        assert kl > 0 and loss == pytest.approx(float(ce) + 0.5 * factor * kl / len(y), rel=1e-5)


@MODELS
def test_fedntd_with_beta_0_is_fedavg_exactly(out, model):
    """The frozen global model runs beside training (eval mode: no BatchNorm update, no dropout draw) and adds
    0 * L_NTD: every step, the global model and every FedAvg metric are FedAvg's; the copy is never uploaded."""
    extra = ("trainer.rounds=2", "optim.momentum=0.9", "trainer.local_steps=3", *model)
    avg = run_tiny(out, "method.name=fedavg", *extra, name="avg")
    ntd = run_tiny(out, "method.name=fedntd", "method.beta=0", *extra, name="ntd")
    ga, gn = global_params(avg), global_params(ntd)
    assert ga.keys() == gn.keys() and all(torch.equal(ga[k], gn[k]) for k in ga)
    assert_fedavg_rows(avg, ntd)
    assert all(r["train/ntd"] > 0 for r in read_metrics(ntd))  # the term was computed
    assert_no_state_beyond_fedavg(ntd)


def test_fedntd_distils_the_global_model_of_the_round_start(out, monkeypatch):
    """At each round's first step the local model is the global model it received, so L_NTD is exactly 0 then
    (no BatchNorm or dropout here) and positive once training moved it; beta = 1 leaves FedAvg's path."""
    seen = []
    original = FedNTDClient.training_step

    def step(self, batch, batch_idx):
        out_ = original(self, batch, batch_idx)
        seen.append((self.round, batch_idx, float(out_["ntd"])))
        return out_

    monkeypatch.setattr(FedNTDClient, "training_step", step)
    ntd = run_tiny(out, "method.name=fedntd", "trainer.rounds=2", "trainer.local_steps=3", name="ntd")
    monkeypatch.undo()
    avg = run_tiny(out, "method.name=fedavg", "trainer.rounds=2", "trainer.local_steps=3", name="avg")
    assert {r for r, _, _ in seen} == {0, 1}
    assert all(v == 0.0 for _, i, v in seen if i == 0)
    assert all(v > 0.0 for _, i, v in seen if i > 0)
    assert max_diff(global_params(ntd), global_params(avg)) > 1e-4


# ---- FedDecorr -----------------------------------------------------------------------------------------------------
def test_decorr_loss_in_closed_form():
    """||K||_F^2 / d^2 with K the correlation matrix over the batch (eps = 1e-8 in the variance)."""
    a = torch.tensor([1.0, 1.0, -1.0, -1.0])
    b = torch.tensor([1.0, -1.0, 1.0, -1.0])
    cases = [
        (torch.tensor([[1.0, 2.0], [3.0, 6.0]]), 1.0),  # perfectly correlated: K = [[1, 1], [1, 1]]
        (torch.tensor([[1.0, -3.0], [3.0, -7.0]]), 1.0),  # anti-correlated: K = [[1, -1], [-1, 1]]
        (torch.stack([a, b], 1), 0.5),  # uncorrelated: K = I
        (torch.stack([a, 2 * a + 5, b], 1), 5 / 9),  # K = [[1, 1, 0], [1, 1, 0], [0, 0, 1]]
        (torch.stack([a, torch.full((4,), 3.0)], 1), 0.25),  # a constant dimension correlates with nothing
        (torch.tensor([[0.7, -0.2, 5.0]]), 0.0),  # one sample: nothing varies
    ]
    for features, value in cases:
        assert float(decorr_loss(features)) == pytest.approx(value, rel=1e-6, abs=1e-7), features
    # the released code's form: correlated N = 2 -> off-diagonal (Z^T Z)_12^2 = 1, / N; uncorrelated -> 0
    assert float(decorr_loss(torch.tensor([[1.0, 2.0], [3.0, 6.0]]), "official")) == pytest.approx(0.5, rel=1e-6)
    assert float(decorr_loss(torch.stack([a, b], 1), "official")) == pytest.approx(0.0, abs=1e-7)


def test_decorr_official_form_through_the_off_diagonal_correlations():
    """official = (N - 1)^2 / (N d (d - 1)) * sum_{i != j} K_ij^2, paper = (d + sum_{i != j} K_ij^2) / d^2."""
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(64, 32, generator=gen, dtype=torch.float64) @ torch.randn(32, 32, generator=gen,
                                                                                      dtype=torch.float64)
    n, d = features.shape
    paper, official = float(decorr_loss(features)), float(decorr_loss(features, "official"))
    off = paper * d ** 2 - d
    assert official == pytest.approx((n - 1) ** 2 / (n * d * (d - 1)) * off, rel=1e-6)
    # invariant to a per-dimension scale and shift
    assert float(decorr_loss(features * torch.linspace(0.5, 3, d, dtype=torch.float64) - 2)) == pytest.approx(paper)


def decorr_value_and_gradient(features, form):
    f = features.clone().requires_grad_(True)
    loss = decorr_loss(f, form)
    return float(loss.detach()), torch.autograd.grad(loss, f)[0]


@pytest.mark.parametrize("kind, d, ratio", [("rank_one", 16, 63 ** 2 / 64), ("independent", 64, 31.13),
                                            ("independent", 512, 55.31)])
def test_decorr_official_over_paper_on_fixed_features(kind, d, ratio):
    """Batch N = 64. The values' ratio depends on the features: (N-1)^2 / N = 62.02 when every pair of dimensions is
    perfectly correlated, 31 (d = 64) and 55 (d = 512) on independent Gaussian features, near the expectation
    (N-1)^2 d / (N (N + d - 2)) for independent features. The gradients are parallel, official's
    (N-1)^2 d / (N (d - 1)) times the paper's: beta 0.05 in the released form is beta ~ 3.1 in the paper's."""
    n = 64
    gen = torch.Generator().manual_seed(3)
    if kind == "rank_one":
        scale = torch.linspace(0.5, 3, d, dtype=torch.float64) * torch.tensor([1.0, -1.0]).repeat(d // 2)
        features = torch.randn(n, 1, generator=gen, dtype=torch.float64) * scale + 7
    else:
        features = torch.randn(n, d, generator=gen, dtype=torch.float64)
        assert ratio == pytest.approx((n - 1) ** 2 * d / (n * (n + d - 2)), rel=0.03)
    paper, grad_paper = decorr_value_and_gradient(features, "paper")
    official, grad_official = decorr_value_and_gradient(features, "official")
    assert official / paper == pytest.approx(ratio, rel=1e-3)
    if kind != "rank_one":  # there R is at its maximum: both gradients are 0 up to rounding
        residual = grad_official - (n - 1) ** 2 * d / (n * (d - 1)) * grad_paper
        assert float(residual.norm()) <= 1e-6 * float(grad_official.norm())


@MODELS
def test_feddecorr_with_beta_0_is_fedavg_exactly(out, model):
    extra = ("trainer.rounds=2", "optim.momentum=0.9", "trainer.local_steps=3", *model)
    avg = run_tiny(out, "method.name=fedavg", *extra, name="avg")
    dec = run_tiny(out, "method.name=feddecorr", "method.beta=0", *extra, name="dec")
    ga, gd = global_params(avg), global_params(dec)
    assert ga.keys() == gd.keys() and all(torch.equal(ga[k], gd[k]) for k in ga)
    assert_fedavg_rows(avg, dec)
    assert all(r["train/decorr"] > 0 for r in read_metrics(dec))
    assert_no_state_beyond_fedavg(dec)


def test_feddecorr_regularises_and_needs_a_backbone(out, capsys):
    avg = run_tiny(out, "method.name=fedavg", "trainer.rounds=1", name="avg")
    dec = run_tiny(out, "method.name=feddecorr", "method.beta=1", "trainer.rounds=1", name="dec")
    assert max_diff(global_params(dec), global_params(avg)) > 1e-4
    assert main(tiny(out, "method.name=feddecorr", "model.name=logistic")) == 2
    assert "feddecorr" in capsys.readouterr().err


CHOSEN = {  # the values each config picks (its comment says why)
    "fednova": {"optim.name": "sgd", "optim.momentum": 0.9},
    "fedlc": {"method.tau": 1.0},
    "fedntd": {"method.beta": 1.0, "method.tau": 1.0, "method.tau_squared": True},
    "feddecorr": {"method.beta": 0.05, "method.form": "official"},
}


@pytest.mark.parametrize("name", METHODS)
def test_configs_hold_the_chosen_values(name):
    cfg = load_config([f"conf={name}_cifar100_dir01"])
    assert {key: OmegaConf.select(cfg, key) for key in CHOSEN[name]} == CHOSEN[name]
