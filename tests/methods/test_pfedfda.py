"""pFedFDA (fl/methods/pfedfda.py, pfedfda_stats.py): the LDA head is the exact Gaussian posterior, solve
agrees with an explicit inverse, the regularised covariance is PD with preserved variances, the estimators
against explicit loops, beta -> 1 / -> 0 in the cases the paper describes, the frozen head during local
training, the server's statistics aggregation against a hand computation, new clients, 1 vs 2 processes."""
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import multivariate_normal

from fl.config import load_config
from fl.methods.pfedfda.stats import (
    cv_objective,
    cv_parts,
    estimate,
    interpolate,
    lda_head,
    nearest_pd_clipped,
    priors,
    regularise,
    solve_beta,
)
from fl.run.train import main
from tests.helpers import assert_same_rows, load_ckpt, orchestrator, read_metrics, tiny
from tests.process_pairs import on_one_and_two_processes

D64 = torch.float64


def random_spd(d, gen, scale=1.0):
    a = torch.randn(d, d, generator=gen, dtype=D64)
    return scale * (a @ a.T / d + 0.5 * torch.eye(d, dtype=D64))


# ---- the Gaussian head -------------------------------------------------------------------------------
def test_lda_softmax_is_the_exact_gaussian_posterior():
    gen = torch.Generator().manual_seed(0)
    C, d = 5, 7
    mu, cov = torch.randn(C, d, generator=gen, dtype=D64), random_spd(d, gen)
    pi = torch.rand(C, generator=gen, dtype=D64) + 0.1
    pi = pi / pi.sum()
    z = torch.randn(50, d, generator=gen, dtype=D64) * 2
    W, b = lda_head(mu, cov, pi.log(), shrink_eps=0.0)
    post = torch.softmax(z @ W.T + b, 1).numpy()
    logjoint = np.stack([multivariate_normal(mu[c].numpy(), cov.numpy()).logpdf(z.numpy()) + np.log(pi[c].item())
                         for c in range(C)], 1)
    exact = np.exp(logjoint - logjoint.max(1, keepdims=True))
    exact /= exact.sum(1, keepdims=True)
    np.testing.assert_allclose(post, exact, rtol=0, atol=1e-10)


def test_solve_agrees_with_explicit_inverse_and_identity_gives_nearest_mean():
    gen = torch.Generator().manual_seed(1)
    C, d = 6, 16
    mu, cov, logp = torch.randn(C, d, generator=gen, dtype=D64), random_spd(d, gen, 3.0), torch.zeros(C, dtype=D64)
    W, b = lda_head(mu, cov, logp, shrink_eps=1e-4)
    s = (1 - 1e-4) * cov + 1e-4 * torch.trace(cov) / d * torch.eye(d, dtype=D64)
    W_inv = mu @ torch.linalg.inv(s)  # s is symmetric: (s^-1 mu^T)^T
    torch.testing.assert_close(W, W_inv, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(b, -0.5 * (mu * W_inv).sum(1), rtol=1e-10, atol=1e-12)
    # Sigma = I, uniform priors: the head is the nearest class mean (Euclidean)
    z = torch.randn(200, d, generator=gen, dtype=D64) * 2
    W, b = lda_head(mu, torch.eye(d, dtype=D64), logp)
    assert torch.equal((z @ W.T + b).argmax(1), torch.cdist(z, mu).argmin(1))


def test_regularised_covariance_is_pd_and_keeps_the_variances():
    gen = torch.Generator().manual_seed(2)
    d, n = 12, 5  # n << d: the raw estimate is rank deficient
    z = torch.randn(n, d, generator=gen, dtype=D64)
    raw = torch.cov(z.T)
    assert torch.linalg.eigvalsh(raw).min() < 1e-12
    for mode, added in (("paper", 1e-4 * torch.eye(d, dtype=D64)), ("code", 1e-4 + torch.eye(d, dtype=D64))):
        reg = regularise(raw, mode)
        assert torch.equal(reg, reg.T)
        torch.testing.assert_close(torch.diagonal(reg), torch.diagonal(raw + added), rtol=1e-12, atol=1e-14)
        assert torch.linalg.eigvalsh(reg).min() > 0
        torch.linalg.cholesky(reg)  # PD
    # an indefinite matrix: eigenvalues of its correlation clipped, variances exactly preserved
    bad = random_spd(d, gen) - 0.8 * torch.eye(d, dtype=D64)
    bad = bad + torch.diag(torch.diagonal(bad).abs() + 0.1 - torch.diagonal(bad))
    assert torch.linalg.eigvalsh(bad).min() < 0
    fixed = nearest_pd_clipped(bad)
    torch.testing.assert_close(torch.diagonal(fixed), torch.diagonal(bad), rtol=1e-12, atol=0)
    assert torch.linalg.eigvalsh(fixed).min() > -1e-12
    # a PD matrix comes back unchanged; a dead feature (zero variance) gives no NaN
    pd = random_spd(d, gen)
    assert torch.equal(nearest_pd_clipped(pd), (pd + pd.T) / 2)
    dead = raw.clone()
    dead[0], dead[:, 0] = 0, 0
    out = regularise(dead, "paper")
    assert torch.isfinite(out).all() and torch.linalg.eigvalsh(out).min() > 0
    W, b = lda_head(torch.randn(3, d, generator=gen, dtype=D64), out, torch.zeros(3, dtype=D64))
    assert torch.isfinite(W).all() and torch.isfinite(b).all()


def test_estimators_against_explicit_loops_with_the_global_mean_fallback():
    gen = torch.Generator().manual_seed(3)
    C, d, n = 5, 4, 40
    z = torch.randn(n, d, generator=gen, dtype=D64)
    y = torch.randint(0, 3, (n,), generator=gen)  # classes 3 and 4 absent
    y[:2] = 3  # class 3 has exactly 2 samples
    fallback = torch.full((C, d), 7.0, dtype=D64)
    mu, cov = estimate(z, y, fallback, "paper")
    scatter = torch.zeros(d, d, dtype=D64)
    for j in range(n):
        m = z[y == y[j]].mean(0)
        scatter += torch.outer(z[j] - m, z[j] - m)
    torch.testing.assert_close(cov, regularise(scatter / (n - 1), "paper"), rtol=1e-12, atol=1e-14)
    for c in range(4):
        torch.testing.assert_close(mu[c], z[y == c].mean(0))
    assert torch.equal(mu[4], fallback[4])
    mu_eval, _ = estimate(z, y, fallback, "paper", min_count=2)  # evaluation: count <= 2 -> global mean
    assert torch.equal(mu_eval[3], fallback[3]) and torch.equal(mu_eval[:3], mu[:3])
    pi = priors(y, C)
    assert pi.sum().item() == pytest.approx(1.0) and (pi > 0).all() and pi[4] < 1e-3


# ---- beta ---------------------------------------------------------------------------------------------
def beta_of(z, y, glob, mode="single", cov_reg="code", seed=0):
    return solve_beta(z, y, glob, priors(y, glob[0].shape[0]).log(), mode=mode, k=2, cov_reg=cov_reg,
                      shrink_eps=1e-4, max_iter=10, gtol=1e-3, gen=torch.Generator().manual_seed(seed))


def gaussian_client(mu, n, gen):
    y = torch.arange(n) % mu.shape[0]
    return mu[y] + torch.randn(n, mu.shape[1], generator=gen, dtype=D64), y


@pytest.mark.parametrize("cov_reg", ["code", "paper"])
def test_beta_goes_to_one_for_plentiful_shifted_data_and_to_zero_for_scarce_matching_data(cov_reg):
    C, d = 4, 8
    mu_g = torch.randn(C, d, generator=torch.Generator().manual_seed(0), dtype=D64)
    glob = (mu_g, torch.eye(d, dtype=D64))
    shifted, matching = [], []
    for seed in range(3):
        gen = torch.Generator().manual_seed(10 + seed)
        z, y = gaussian_client(mu_g[[1, 2, 3, 0]], 2000, gen)  # the global Gaussians with labels rotated
        shifted.append(beta_of(z, y, glob, cov_reg=cov_reg))
        z, y = gaussian_client(mu_g, 16, gen)  # a few samples of the global distribution itself
        matching.append(beta_of(z, y, glob, cov_reg=cov_reg))
    assert all(r.beta_mu > 0.8 and not r.fallback for r in shifted)
    assert all(r.beta_mu < 0.4 for r in matching) and np.mean([r.beta_mu for r in matching]) < 0.2
    for r in shifted + matching:
        assert 0.0 <= r.beta_mu <= 1.0 and r.beta_mu == r.beta_cov  # single beta: one value for both


def test_fast_cv_objective_equals_the_direct_solve():
    # the beta search evaluates J through one eigendecomposition per fold; it must equal Eq. 9 computed with
    # the LDA head's solve for every (beta_mu, beta_cov)
    C, d = 5, 12
    gen = torch.Generator().manual_seed(5)
    glob = (torch.randn(C, d, generator=gen, dtype=D64), random_spd(d, gen, 2.0))
    z, y = gaussian_client(torch.randn(C, d, generator=gen, dtype=D64), 60, gen)
    y[y == 4] = 3  # class 4 absent: its local mean falls back to the global one
    logp = priors(y, C).log()
    for cov_reg in ("code", "paper"):
        parts = cv_parts(z, y, glob, 2, cov_reg, torch.Generator().manual_seed(0))
        J = cv_objective(parts, glob, logp, 1e-4)
        for bm, bc in [(0.0, 0.0), (1.0, 1.0), (0.3, 0.7), (0.9, 0.1)]:
            direct = 0.0
            for local, zv, yv in parts:
                W, b = lda_head(*interpolate(bm, bc, local, glob), logp, 1e-4)
                direct += torch.nn.functional.cross_entropy(zv @ W.T + b, yv).item()
            bm_t, bc_t = torch.tensor(bm, dtype=D64), torch.tensor(bc, dtype=D64)
            assert J(bm_t, bc_t).item() == pytest.approx(direct, rel=1e-10)


def test_beta_modes_and_the_cv_failure_path():
    C, d = 3, 4
    gen = torch.Generator().manual_seed(4)
    glob = (torch.randn(C, d, generator=gen, dtype=D64), torch.eye(d, dtype=D64))
    z, y = gaussian_client(glob[0] * 0.3, 300, gen)
    assert beta_of(z, y, glob, mode="local_only").beta_mu == 1.0
    sep = beta_of(z, y, glob, mode="separate")
    assert 0 <= sep.beta_mu <= 1 and 0 <= sep.beta_cov <= 1 and not sep.fallback
    one = beta_of(z[:1], y[:1], glob)  # a single sample: no class has k=2 members, CV impossible
    assert (one.beta_mu, one.beta_cov, one.fallback) == (0.0, 0.0, True)
    # endpoints of the interpolation
    local = (torch.ones(C, d, dtype=D64), 2 * torch.eye(d, dtype=D64))
    assert all(torch.equal(a, b) for a, b in zip(interpolate(1.0, 1.0, local, glob), local))
    assert all(torch.equal(a, b) for a, b in zip(interpolate(0.0, 0.0, local, glob), glob))


# ---- the method in the framework ----------------------------------------------------------------------
def build(out: Path, *extra):
    cfg = load_config(tiny(out, "method.name=pfedfda", "fabric.cpu_threads=1", *extra))
    torch.set_num_threads(1)
    orch = orchestrator(cfg, out)
    return orch, orch.server


def test_frozen_head_statistics_aggregation_and_new_clients(out):
    orch, server = build(out, "trainer.local_epochs=2")
    m = orch.module
    mu0, cov0 = server.mu.clone(), server.cov.clone()
    assert torch.equal(cov0, torch.eye(m.model.feature_dim, dtype=D64)) and mu0.min() >= 0 and mu0.max() < 1
    backbone0 = {k: v.clone() for k, v in server.global_params.items()}
    assert not any(k.startswith("model.head.") for k in backbone0)  # the head is never averaged
    uploads, messages = {}, {}
    for cid in (0, 2):
        upload, result = orch.train_client(0, cid)
        W, b = lda_head(mu0, cov0, priors(orch.data.clients[cid].train.y, orch.data.num_classes).log(), 1e-4)
        assert torch.equal(m.model.head.weight, W.float()) and torch.equal(m.model.head.bias, b.float())
        assert not m.model.head.weight.requires_grad
        assert any(not torch.equal(upload.params[k], backbone0[k]) for k in backbone0)  # the backbone trained
        beta = result.message["beta"]
        assert 0 <= beta <= 1 and result.state["beta"] == (beta, beta)
        assert result.message["n"] == len(orch.data.clients[cid].train)
        uploads[cid], messages[cid] = upload, result.message
    # hand computation: n_i-weighted mean of the interpolated statistics
    n0, n2 = messages[0]["n"], messages[2]["n"]
    mu_hand = (n0 * messages[0]["mu"] + n2 * messages[2]["mu"]) / (n0 + n2)
    cov_hand = (n0 * messages[0]["cov"] + n2 * messages[2]["cov"]) / (n0 + n2)
    server.server_step(orch.context(0), {k: v.clone() for k, v in uploads[0].params.items()}, messages)
    torch.testing.assert_close(server.mu, mu_hand, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(server.cov, cov_hand, rtol=1e-12, atol=1e-14)
    assert torch.linalg.eigvalsh(server.cov).min() > 0
    # a client that never trained is personalised from its own data with no gradient step
    orch.load_client(1, 5)
    before = {k: v.clone() for k, v in m.model.backbone.state_dict().items()}
    logs = m.personalize()
    assert all(torch.equal(v, m.model.backbone.state_dict()[k]) for k, v in before.items())
    assert 0 <= logs["beta_eval"] <= 1 and torch.isfinite(m.model.head.weight).all()
    assert not torch.equal(m.model.head.weight, lda_head(server.mu, server.cov, torch.zeros(orch.data.num_classes,
                                                                                           dtype=D64))[0].float())


def test_end_to_end_logs_betas_and_uses_every_client_in_the_last_round(out):
    assert main(tiny(out, "method.name=pfedfda", "fabric.cpu_threads=1", "logger.run_name=e2e",
                     "trainer.evaluators=[]", "method.beta_mode=separate")) == 0
    rows = read_metrics(out / "outputs" / "e2e")
    assert [r["train/clients"] for r in rows] == [3.0, 3.0, 6.0]  # participation 0.5, all in the last round
    last = rows[-1]
    for cid in range(6):
        assert 0 <= last[f"client/{cid}/beta"] <= 1 and 0 <= last[f"client/{cid}/beta_cov"] <= 1
        assert 0 <= last[f"client/{cid}/beta_eval"] <= 1
    assert last["test/acc_weighted"] > 1.5 / 10  # above chance (10 classes) after 3 tiny rounds
    ckpt = load_ckpt(out / "outputs" / "e2e")
    assert {"mu", "cov"} <= ckpt["server"].keys()
    assert all(len(state["beta"]) == 2 for state in ckpt["clients"].values())


@on_one_and_two_processes("pfedfda", "method.name=pfedfda", "trainer.rounds=3", "data.num_clients=7",
                          "trainer.evaluators=[]")
def pfedfda_same_on_one_and_two_processes(one: Path, two: Path) -> None:
    assert_same_rows(read_metrics(one), read_metrics(two), abs=1e-6)
    ca, cb = load_ckpt(one), load_ckpt(two)
    torch.testing.assert_close(cb["server"]["mu"], ca["server"]["mu"], rtol=0, atol=1e-6)
    torch.testing.assert_close(cb["server"]["cov"], ca["server"]["cov"], rtol=0, atol=1e-6)
    for k, v in ca["server"]["global_params"].items():
        torch.testing.assert_close(cb["server"]["global_params"][k], v, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", sorted(p.stem for p in (Path(__file__).parents[2] / "conf").glob("pfedfda_*.yaml")))
def test_configs_load_with_the_papers_settings(name):
    cfg = load_config([f"conf={name}"])
    assert cfg.method.name == "pfedfda" and cfg.method.beta_mode == "single" and cfg.method.cov_reg == "code"
    assert cfg.optim.lr == 0.01 and cfg.optim.momentum == 0.5 and cfg.optim.weight_decay == 5e-4
    assert cfg.model.name in {"cifarnet", "emnistnet", "resnet18"} and cfg.trainer.drop_last
    assert (cfg.data.name in {"embedded", "embedded_domains"}) == name.endswith("_synthetic")
    twin = Path(__file__).parents[2] / "conf" / (name if name.endswith("_synthetic") else name + "_synthetic")
    assert twin.with_suffix(".yaml").is_file()
