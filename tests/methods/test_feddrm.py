"""FedDRM (Wang et al. 2025): the dual identity, Gaussian density-ratio recovery by the client head, routing
rules, loss composition, the private head staying on the client. (Its FedRep baseline: test_split_models.py.)"""
import math

import pytest
import torch
from torch import nn

from fl.config import load_config
from fl.core.loop import payload_bytes
from fl.data import build_data
from fl.methods.feddrm import FedDRMClient, FedDRMNet, feddrm_loss, log_size_prior, route_scores
from fl.metrics.el_weights import el_log_weights
from fl.run.train import main
from tests.helpers import load_ckpt, read_metrics, run_tiny, tiny


def test_dual_identity_two_cross_entropies_equal_the_profile_el():
    """Thm 2.2: with rho = n/N, sum_ij (s_i(x_ij) + log p_ij) = -sum_i n_i CE_client(s + log n, i) - sum n log n,
    for any logits; the CE is the one FedDRM's clients minimise."""
    g = torch.Generator().manual_seed(0)
    n = [7, 3, 12, 5]
    N, m = sum(n), len(n)
    S = [torch.randn(k, m, generator=g, dtype=torch.float64) * 2 for k in n]
    rho = torch.tensor(n, dtype=torch.float64) / N
    lhs = 0.0
    for i, s in enumerate(S):
        p = 1.0 / (N * (1.0 + ((s.exp() - 1.0) * rho).sum(1)))  # the profiled EL weights (App. C.2)
        lhs += float((s[:, i] + p.log()).sum())
    log_n = torch.tensor(n, dtype=torch.float64).log()
    rhs = 0.0
    for i, s in enumerate(S):
        y = torch.zeros(len(s), dtype=torch.long)
        loss, _, ce_client = feddrm_loss(torch.zeros(len(s), 2, dtype=torch.float64), s + log_n, y, i, lam=0.0)
        assert float(loss) == float(ce_client)
        rhs -= n[i] * float(ce_client)
    rhs -= sum(k * math.log(k) for k in n)
    assert lhs == pytest.approx(rhs, abs=1e-9)


def test_loss_composition_lambda_routes_the_gradient():
    torch.manual_seed(0)
    net = FedDRMNet(nn.Sequential(nn.Linear(5, 8), nn.ReLU()), 8, num_classes=3, num_clients=4, proj_dim=6)
    x, y = torch.randn(10, 5), torch.randint(0, 3, (10,))
    for lam, silent in ((1.0, ("client_proj", "client_head")), (0.0, ("head.", "target_proj"))):
        net.zero_grad(set_to_none=True)
        zt, zc = net(x)
        feddrm_loss(zt, zc, y, 2, lam)[0].backward()
        for name, p in net.named_parameters():
            if name.startswith(silent):
                assert p.grad is None or float(p.grad.abs().max()) == 0.0, name
        assert any(p.grad is not None and float(p.grad.abs().max()) > 0 for p in net.backbone.parameters())
    # a single-client batch: dCE/dz_k = (p_k - 1[k = i]) / B, so only logit i is pushed up
    z = torch.randn(4, 4, requires_grad=True)
    feddrm_loss(torch.zeros(4, 3), z, torch.zeros(4, dtype=torch.long), 1, 0.0)[0].backward()
    expected = (z.detach().softmax(1) - nn.functional.one_hot(torch.tensor(1), 4)) / 4
    torch.testing.assert_close(z.grad, expected)


def test_client_head_recovers_a_gaussian_density_ratio():
    """1-d Gaussians N(mu_l, 1): the log density ratio is linear in x, so the client head fitted by the client
    CE recovers w_l - w_0 = mu_l - mu_0 and (a_l - log n_l) - (a_0 - log n_0) = -(mu_l^2 - mu_0^2) / 2."""
    g = torch.Generator().manual_seed(1)
    mu, n = [-1.0, 0.5, 2.0], [6000, 3000, 12000]
    xs = [torch.randn(k, 1, generator=g, dtype=torch.float64) + m for m, k in zip(mu, n)]
    torch.manual_seed(0)
    net = FedDRMNet(nn.Identity(), 1, num_classes=2, num_clients=3, proj_dim=0).double()
    opt = torch.optim.LBFGS(net.client_head.parameters(), lr=1, max_iter=500, tolerance_grad=1e-12,
                            tolerance_change=1e-14, line_search_fn="strong_wolfe")
    N = sum(n)

    def closure():  # the federated objective sum_i (n_i / N) * client i's loss, lambda = 0
        opt.zero_grad()
        loss = sum(k / N * feddrm_loss(*net(x), torch.zeros(k, dtype=torch.long), i, 0.0)[0]
                   for i, (x, k) in enumerate(zip(xs, n)))
        loss.backward()
        return loss

    opt.step(closure)
    w, a = net.client_head.weight.detach()[:, 0], net.client_head.bias.detach()
    log_n = torch.tensor(n, dtype=torch.float64).log()
    for k in (1, 2):
        assert float(w[k] - w[0]) == pytest.approx(mu[k] - mu[0], abs=0.08)
        assert float((a[k] - log_n[k]) - (a[0] - log_n[0])) == pytest.approx(-(mu[k] ** 2 - mu[0] ** 2) / 2, abs=0.15)
    # at the unpenalised MLE the intercept score equations hold: sum_ij softmax_l = n_l (EL constraint (5)),
    # and the EL weights are a distribution over the pooled atoms
    z = net.client_logits(torch.cat(xs)).detach()
    torch.testing.assert_close(z.softmax(1).sum(0), log_n.exp(), rtol=1e-6, atol=1e-5)
    assert float(el_log_weights(z).exp().sum()) == pytest.approx(1.0, abs=1e-12)
    # density-ratio routing with the fitted head agrees with the true likelihood argmax almost everywhere
    grid = torch.linspace(-4, 5, 901, dtype=torch.float64).unsqueeze(1)
    truth = (-(grid - torch.tensor(mu, dtype=torch.float64)) ** 2 / 2).argmax(1)
    got = route_scores(net.client_logits(grid).detach(), log_size_prior(n), "density_ratio").argmax(1)
    assert float((got == truth).double().mean()) > 0.97


def test_routing_rules_on_hand_made_logits():
    """Posterior logits of a 2-d Gaussian model, log n_l + log N(x; mu_l, I) + c: posterior routing is the Bayes
    rule with the size prior, density_ratio routing the likelihood argmax; with equal sizes they coincide."""
    g = torch.Generator().manual_seed(2)
    mu = torch.tensor([[0.0, 0.0], [1.5, 0.0], [0.0, 1.5]], dtype=torch.float64)
    x = torch.randn(2000, 2, generator=g, dtype=torch.float64) * 1.5 + 0.5
    loglik = -((x[:, None, :] - mu[None]) ** 2).sum(-1) / 2
    for n in ([100, 1000, 10], [50, 50, 50]):
        log_n = torch.tensor(n, dtype=torch.float64).log()
        logits = log_n + loglik + 3.7  # any common shift
        dr = route_scores(logits, log_size_prior(n), "density_ratio").argmax(1)
        post = route_scores(logits, log_size_prior(n), "posterior").argmax(1)
        assert torch.equal(dr, loglik.argmax(1))
        assert torch.equal(post, (log_n + loglik).argmax(1))
        assert torch.equal(dr, post) == (len(set(n)) == 1)  # unequal sizes: the rules really differ somewhere
    # an empty client is never chosen by the density ratio (log prior -inf)
    scores = route_scores(torch.zeros(3, 3), log_size_prior([5, 0, 5]), "density_ratio")
    assert bool((scores.argmax(1) != 1).all())


def test_module_routes_with_its_client_head(out):
    for rule in ("posterior", "density_ratio"):
        cfg = load_config(tiny(out, "method.name=feddrm", f"method.routing={rule}", "model.proj_dim=8"))
        data = build_data(cfg)
        module = FedDRMClient(cfg, data)
        x = data.prepare(data.clients[0].test.x[:5])
        sizes = torch.tensor(data.train_sizes(), dtype=torch.float64)
        shift = (sizes / sizes.sum()).log().float() if rule == "density_ratio" else 0.0
        torch.testing.assert_close(module.route_scores(x), module.model.client_logits(x) - shift)
        assert module.model.client_head.out_features == data.num_clients
        assert set(module.private_state()) == {"model.head.weight", "model.head.bias"}


def test_private_head_never_leaves_the_client(out):
    assert main(tiny(out, "method.name=feddrm", "model.proj_dim=8", "trainer.participation=1.0",
                     "trainer.rounds=2", "logger.run_name=drm")) == 0
    run_dir = out / "outputs" / "drm"
    ckpt = load_ckpt(run_dir)
    shared = ckpt["server"]["global_params"]
    assert not any(k.startswith("model.head.") for k in shared)
    assert {"model.client_head.weight", "model.target_proj.0.weight", "model.client_proj.0.weight"} <= set(shared)
    heads = [ckpt["clients"][c]["private"]["model.head.weight"] for c in sorted(ckpt["clients"])]
    assert len(heads) == 6 and all(not torch.equal(heads[0], h) for h in heads[1:])  # personal, trained apart
    rows = read_metrics(run_dir)
    # what went up is exactly the shared parameters of each client, the head excluded
    assert rows[-1]["comm/bytes_up"] == 6 * payload_bytes(shared)
    assert {"client/0/ce_target", "client/0/ce_client", "test/system_acc", "test/routing_acc"} <= set(rows[-1])


def test_real_config_runs_on_fabricated_cifar10_and_names_its_twin_without_data(out, capsys):
    """feddrm_cifar10_dir03 end to end (ResNet-18 GN, colour transforms, resized crops) on a tiny fake CIFAR-10."""
    from tests import fakes

    fakes.cifar10(out / "data", per_batch=12)
    args = ["conf=feddrm_cifar10_dir03", f"data.root={out / 'data'}", f"logger.output_dir={out / 'outputs'}",
            "logger.wandb.mode=disabled", "logger.progress=false", "data.num_clients=2",
            "data.partition.min_client_size=5",
            "trainer.rounds=1", "trainer.local_steps=2", "trainer.batch_size=8", "logger.run_name=real"]
    assert main(args) == 0
    row = read_metrics(out / "outputs" / "real")[-1]
    assert {"test/system_acc", "test/routing_acc", "test/acc_weighted_train"} <= set(row)
    assert main(["conf=feddrm_cifar10_dir03", f"data.root={out / 'empty'}", f"logger.output_dir={out / 'o2'}",
                 "logger.wandb.mode=disabled"]) == 2
    assert capsys.readouterr().err.strip().endswith("python -m fl.train conf=feddrm_cifar10_dir03_synthetic")


def test_the_empirical_likelihood_diagnostics_equal_a_hand_computation(out):
    """server/el_*: from the final global model's client logits on every client's training data, by hand."""
    from fl.config import load_config
    from fl.core import make_client_module
    from fl.data import build_data
    from fl.run.train import make_fabric

    run_dir = run_tiny(out, "method.name=feddrm", "trainer.rounds=2", "model.proj_dim=8", name="el")
    row = read_metrics(run_dir)[-1]
    cfg = load_config(tiny(out, "method.name=feddrm", "trainer.rounds=2", "model.proj_dim=8"))
    fabric = make_fabric(cfg, [], [])
    module, data = make_client_module(cfg, fabric, build_data(cfg))
    module.load_state_dict(load_ckpt(run_dir)["server"]["global_params"], strict=False)
    module.eval()
    with torch.no_grad():
        z = torch.cat([module.client_scores(module.make_batch(c.train, slice(None))[0])
                       for c in data.clients]).double()
    p = el_log_weights(z).exp()
    n = torch.tensor(data.train_sizes(), dtype=torch.float64)
    assert row["server/el_weight_ess_frac"] == pytest.approx(float(p.sum() ** 2 / (len(p) * (p * p).sum())), rel=1e-9)
    assert row["server/el_weight_max_ratio"] == pytest.approx(float(len(p) * p.max()), rel=1e-9)
    gap = float((torch.softmax(z, 1).sum(0) / n - 1).abs().max())
    assert row["server/el_marginal_gap"] == pytest.approx(gap, rel=1e-9)
