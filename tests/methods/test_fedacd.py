"""FedACD (fl/methods/fedacd.py, fedacd_losses.py) and the adaptability diagnostics (fl/metrics/adaptability.py):
the spec's closed forms for L1, L2, P, Q, V and the adaptability risk; V-weighted aggregation against the
uploads; the diagnostics for other methods; 1 vs 2 processes."""
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fl.config import load_config
from fl.methods.fedacd.losses import (
    accumulate,
    adjustment_matrix,
    l1_flatten,
    l2_adjusted_ce,
    rows_from,
    score_v,
    v_weights,
)
from fl.metrics.adaptability import adaptability_risk, client_dist_accuracy, kl_pq, mean_label_distribution, template_q
from fl.run.train import main
from tests.helpers import assert_same_rows, load_ckpt, orchestrator, read_metrics, tiny
from tests.helpers import run_tiny as run
from tests.process_pairs import on_one_and_two_processes


def l1_direct(p: torch.Tensor, y: torch.Tensor, detach_q: bool = False) -> torch.Tensor:
    """Eq. 7 as written: sum_k p_k log(p_k / q_k) with q_y = p_y, q_k = (1 - p_y)/(C - 1)."""
    C = p.shape[1]
    py = p.gather(1, y[:, None])
    q = ((1 - py) / (C - 1)).expand_as(p).clone()
    q.scatter_(1, y[:, None], py)
    if detach_q:
        q = q.detach()
    return (p * (p.log() - q.log())).sum(1)


# ---- L1 ----------------------------------------------------------------------------------------

def test_l1_matches_the_direct_formula_and_its_closed_form():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(32, 7, generator=g, dtype=torch.float64) * 2
    y = torch.randint(0, 7, (32,), generator=g)
    logp = F.log_softmax(logits, 1)
    p = logp.exp()
    stable = l1_flatten(logp, y)
    torch.testing.assert_close(stable, l1_direct(p, y), rtol=1e-10, atol=1e-12)
    # closed form (1 - p_y) KL(p~ || U_{C-1}) and L1 >= 0
    py = p.gather(1, y[:, None]).squeeze(1)
    mask = F.one_hot(y, 7).bool()
    pt = p.masked_fill(mask, 0) / (1 - py)[:, None]
    kl_u = torch.where(mask, torch.zeros_like(pt), pt * (pt.log() + math.log(6))).sum(1)
    torch.testing.assert_close(stable, (1 - py) * kl_u, rtol=1e-9, atol=1e-12)
    assert (stable >= 0).all() and (stable > 1e-6).all()


def test_l1_is_zero_exactly_when_off_target_probabilities_are_uniform():
    C = 5
    for py in (0.05, 0.2, 0.9, 0.999):
        p = torch.full((1, C), (1 - py) / (C - 1), dtype=torch.float64)
        p[0, 2] = py
        assert float(l1_flatten(p.log(), torch.tensor([2]))) == pytest.approx(0.0, abs=1e-15)
        p2 = p.clone()
        p2[0, 0] += 0.01 * (1 - py)
        p2[0, 1] -= 0.01 * (1 - py)  # same p_y, off-target mass no longer flat
        assert float(l1_flatten(p2.log(), torch.tensor([2]))) > 1e-8


def test_detaching_the_l1_target_leaves_the_gradient_unchanged():
    g = torch.Generator().manual_seed(1)
    z = torch.randn(16, 6, generator=g, dtype=torch.float64)
    y = torch.randint(0, 6, (16,), generator=g)
    grads = []
    for detach in (False, True):
        zz = z.clone().requires_grad_(True)
        l1_direct(F.softmax(zz, 1), y, detach_q=detach).sum().backward()
        grads.append(zz.grad)
    zz = z.clone().requires_grad_(True)
    l1_flatten(F.log_softmax(zz, 1), y).sum().backward()
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(zz.grad, grads[0], rtol=1e-8, atol=1e-12)


def test_l1_is_finite_at_large_margins_and_zero_for_two_classes():
    z = torch.tensor([[60.0, 0.0, 1.0, -3.0]], requires_grad=True)  # p_y ~ 1 - 1e-26 in float32
    loss = l1_flatten(F.log_softmax(z, 1), torch.tensor([0]))
    loss.backward()
    assert torch.isfinite(loss).all() and torch.isfinite(z.grad).all()
    z2 = torch.randn(8, 2)
    assert torch.equal(l1_flatten(F.log_softmax(z2, 1), torch.randint(0, 2, (8,))), torch.zeros(8))


# ---- L2 and the adjustment matrix ----------------------------------------------------------------

def test_l2_with_a_symmetric_p_is_plain_cross_entropy_and_matches_eq_8():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(20, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 5, (20,), generator=g)
    S = torch.rand(5, 5, generator=g, dtype=torch.float64)
    A_sym = adjustment_matrix(S + S.T, torch.ones(5, dtype=torch.bool), 1e-3)
    assert torch.equal(A_sym, torch.zeros(5, 5, dtype=torch.float64))
    assert torch.equal(l2_adjusted_ce(logits, y, A_sym), F.cross_entropy(logits, y, reduction="none"))
    # Eq. 8 written out: log(1 + sum_{i != y} exp(f_i - f_y + log(P_yi / P_iy)))
    P = torch.softmax(torch.randn(5, 5, generator=g, dtype=torch.float64), 1)
    A = adjustment_matrix(P, torch.ones(5, dtype=torch.bool), 1e-3)
    expected = torch.stack([
        torch.log1p(sum(torch.exp(logits[n, i] - logits[n, y[n]] + torch.log(P[y[n], i] / P[i, y[n]]))
                        for i in range(5) if i != y[n])) for n in range(20)])
    torch.testing.assert_close(l2_adjusted_ce(logits, y, A), expected, rtol=1e-10, atol=1e-12)


def test_adjustment_matrix_is_antisymmetric_and_missing_columns_get_log_delta():
    P = torch.softmax(torch.randn(6, 6, dtype=torch.float64), 1)
    A = adjustment_matrix(P, torch.ones(6, dtype=torch.bool), 1e-3)
    torch.testing.assert_close(A, -A.T)
    assert torch.equal(A.diagonal(), torch.zeros(6, dtype=torch.float64))
    assert A[1, 4] == torch.log(P[1, 4]) - torch.log(P[4, 1])  # row = true class
    present = torch.tensor([True, True, False, True, False, True])
    A = adjustment_matrix(P, present, 1e-3)
    for k in (2, 4):
        off = [i for i in range(6) if i != k]
        assert torch.allclose(A[off, k], torch.full((5,), math.log(1e-3), dtype=torch.float64))
    assert A[0, 1] == torch.log(P[0, 1]) - torch.log(P[1, 0])


# ---- P accumulation, Q, KL, V ---------------------------------------------------------------------

def test_p_accumulation_is_the_per_class_mean_with_duplicate_labels():
    g = torch.Generator().manual_seed(3)
    probs = torch.softmax(torch.randn(30, 4, generator=g), 1)
    y = torch.tensor([0, 0, 0, 2, 2] * 6)  # duplicates; classes 1 and 3 absent
    sums, w = torch.zeros(4, 4, dtype=torch.float64), torch.zeros(4, dtype=torch.float64)
    accumulate(sums, w, probs[:15], y[:15], 1.0)
    accumulate(sums, w, probs[15:], y[15:], 1.0)
    prev = torch.full((4, 4), 0.25, dtype=torch.float64)
    P = rows_from(sums, w, prev)
    for k in (0, 2):
        torch.testing.assert_close(P[k], probs[y == k].double().mean(0))
    assert torch.equal(P[1], prev[1]) and torch.equal(P[3], prev[3])
    torch.testing.assert_close(P.sum(1), torch.ones(4, dtype=torch.float64))
    # mixup: mu to y_a's rows, 1 - mu to y_b's rows
    sums.zero_(), w.zero_()
    accumulate(sums, w, probs[:2], torch.tensor([0, 1]), 0.3)
    accumulate(sums, w, probs[:2], torch.tensor([1, 1]), 0.7)
    torch.testing.assert_close(w, torch.tensor([0.3, 1.7, 0, 0], dtype=torch.float64))
    torch.testing.assert_close(sums[1], (0.3 * probs[1] + 0.7 * probs[0] + 0.7 * probs[1]).double())


def test_q_kl_and_v():
    Q = template_q(10, 0.9)
    torch.testing.assert_close(Q.sum(1), torch.ones(10, dtype=torch.float64))
    assert Q[3, 3] == 0.9 and Q[3, 4] == pytest.approx(0.1 / 9)
    present = torch.ones(10, dtype=torch.bool)
    assert float(kl_pq(Q, present, 0.9)) == pytest.approx(0.0, abs=1e-15)
    assert score_v(kl_pq(Q, present, 0.9)) == 1.0  # KL = 0: guarded, V = 1
    # the spec's Table 9 check: P_ii = 0.9 with flat off-diagonals, C = 100, tau = 1 - 1e-5: KL ~ 0.83 per row
    P = template_q(100, 0.9)
    kl = float(kl_pq(P, torch.ones(100, dtype=torch.bool), 1 - 1e-5))
    assert kl == pytest.approx(0.9 * math.log(0.9 / (1 - 1e-5)) + 0.1 * math.log((0.1 / 99) / (1e-5 / 99)), rel=1e-9)
    assert 0.8 < kl < 0.86
    # reductions: mean over present rows, the literal sum, the sum / C
    half = torch.arange(100) < 50
    Pr = torch.softmax(torch.randn(100, 100, dtype=torch.float64), 1)
    mean = float(kl_pq(Pr, half, 1 - 1e-5))
    assert float(kl_pq(Pr, half, 1 - 1e-5, "sum")) == pytest.approx(50 * mean)
    assert float(kl_pq(Pr, half, 1 - 1e-5, "batchmean_C")) == pytest.approx(50 * mean / 100)
    # V in (0.5, 1), decreasing in KL; weights on the simplex
    vs = [score_v(k) for k in (0.01, 0.5, 1.0, 5.0, 1e6)]
    assert all(0.5 < v < 1 or v == 1.0 for v in vs) and vs == sorted(vs, reverse=True) and vs[-1] > 0.5
    w = v_weights(vs)
    assert float(w.sum()) == pytest.approx(1.0) and (w > 0).all()
    assert torch.allclose(v_weights([0.7] * 4), torch.full((4,), 0.25, dtype=torch.float64))


# ---- adaptability metrics (FedACD Eq. 3-5, Theorem 1) ---------------------------------------------

def test_equal_class_errors_have_risk_norm_over_c_for_any_distributions():
    g = torch.Generator().manual_seed(4)
    C, M = 6, 9
    counts = torch.randint(0, 50, (M, C), generator=g)
    eps = torch.full((C,), 0.37, dtype=torch.float64)
    risk = adaptability_risk(eps[None], mean_label_distribution(counts), torch.ones(C, dtype=torch.bool))
    assert float(risk) == pytest.approx(float(eps.sum()) / C)


def test_theorem_1_counter_example():
    """Unequal class errors with the same ||eps||_1: the paper's adversarial distributions give
    R = eps*/C + (theta/M)(eps_r - eps_s) > eps*/C (M > C)."""
    C, M, theta = 4, 6, 0.1
    eps = torch.tensor([0.1, 0.5, 0.2, 0.4], dtype=torch.float64)
    r, s = int(eps.argmax()), int(eps.argmin())
    pi_m = torch.tensor([0.4, 0.1, 0.3, 0.2], dtype=torch.float64)
    delta_m = pi_m - 1 / C
    total = -delta_m.clone()
    total[r] += theta
    total[s] -= theta
    others = [1 / C + total / (M - 1) for _ in range(M - 1)]
    pis = torch.stack([pi_m, *others])
    assert torch.allclose(pis.sum(1), torch.ones(M, dtype=torch.float64)) and (pis >= 0).all()
    risk = float(adaptability_risk(eps[None], pis.mean(0), torch.ones(C, dtype=torch.bool)))
    expected = float(eps.sum()) / C + theta / M * float(eps[r] - eps[s])
    assert risk == pytest.approx(expected) and risk > float(eps.sum()) / C


def test_client_distribution_accuracy_is_pi_bar_weighted_and_equals_resampled_test_sets():
    counts = torch.tensor([[10, 0, 30], [5, 5, 0], [0, 1, 3]])
    acc = torch.tensor([0.9, 0.5, 0.2], dtype=torch.float64)
    pi_bar = mean_label_distribution(counts)
    torch.testing.assert_close(pi_bar, torch.tensor([(0.25 + 0.5) / 3, (0.5 + 0.25) / 3, (0.75 + 0.75) / 3],
                                                    dtype=torch.float64))
    value = float(client_dist_accuracy(acc, pi_bar, torch.ones(3, dtype=torch.bool)))
    # a test set drawn exactly with each client's label proportions (400 samples), then averaged over clients
    per_client = [float((counts[n].double() / counts[n].sum() * acc).sum()) for n in range(3)]
    assert value == pytest.approx(sum(per_client) / 3)


# ---- the method in runs ------------------------------------------------------------------------------

def test_server_averages_uploads_with_v_weights(out):
    """One round driven by hand: the uploads of the sampled clients, averaged with V_m / sum V_k, are the
    new global model; uniform aggregation (FedACD_base) gives the plain mean of the same uploads."""
    from fl.core.loop import sample_clients

    for aggregation in ("v", "uniform"):
        cfg = load_config(tiny(out, "method.name=fedacd", f"method.aggregation={aggregation}", "trainer.rounds=1",
                               "model.norm=batch", "trainer.local_epochs=2"))
        torch.set_num_threads(1)
        orch = orchestrator(cfg, out / f"run-{aggregation}")
        data, server = orch.data, orch.server
        clients = sample_clients(cfg.seed, 0, data.num_clients, cfg.trainer.participation)
        uploads = {cid: orch.train_client(0, cid)[0] for cid in clients}
        V = {cid: u.message["V"] for cid, u in uploads.items()}
        assert all(0.5 < v < 1 for v in V.values()) and len(set(V.values())) == len(V)
        w = v_weights([V[c] for c in clients]) if aggregation == "v" else torch.full((len(clients),), 1 / len(clients),
                                                                                      dtype=torch.float64)
        orch.run_round(0)  # retrains the same clients with the same seeds, then aggregates
        for k, g in server.global_params.items():
            stack = torch.stack([uploads[c].params[k].double() for c in clients])
            if g.is_floating_point():
                expected = (w.view(-1, *[1] * (stack.dim() - 1)) * stack).sum(0)
                torch.testing.assert_close(g.double(), expected, rtol=1e-6, atol=1e-7)
            else:  # BatchNorm's counter: the maximum
                assert torch.equal(g.double(), stack.max(0).values)
        assert set(orch.store.state_dict()) == set(clients)
        for cid in clients:  # the clean-pass P the client keeps: rows of its classes sum to 1
            P = orch.store.get(cid)["kept_P"]
            present = torch.bincount(data.clients[cid].train.y, minlength=data.num_classes) > 0
            torch.testing.assert_close(P[present].sum(1), torch.ones(int(present.sum()), dtype=P.dtype))
            assert (P[~present] == 0).all()


def test_fedacd_logs_scores_losses_and_diagnostics_that_agree(out):
    rows = read_metrics(run(out, "method.name=fedacd", "evaluators.adaptability.every=2", "data.test_split=official",
                            "method.p_update=running", name="acd"))
    assert len(rows) == 3
    for r in rows:
        assert {"train/l1", "train/l2", "server/V_mean", "server/kl_PQ_mean"} <= r.keys()
        assert r["train/loss"] == pytest.approx(r["train/l1"] + r["train/l2"], rel=1e-6)
        Vs = [v for k, v in r.items() if k.endswith("/V") and k.startswith("client/")]
        assert len(Vs) == 3 and all(0.5 < v < 1 for v in Vs)
        # the uniform official test split: acc_global_balanced (class mean) is the pooled micro accuracy
        assert r["test/acc_global_balanced"] == pytest.approx(r["test/acc_global_micro"], abs=1e-6)
    # adaptability rounds: (rnd + 1) % 2 == 0 and the last; the evaluator's KL (its own clean pass) equals
    # the KL behind the clients' V
    assert [("test/adaptability" in r) for r in rows] == [False, True, True]
    for r in rows[1:]:
        assert r["test/kl_PQ"] == pytest.approx(r["server/kl_PQ_mean"], rel=1e-9)
        assert 0 < r["test/adaptability"] < 1
    # test/absent_mass from the P each client of the last round keeps: the mass its rows put on classes it lacks
    kept = load_ckpt(out / "outputs" / "acd")["clients"]
    last = [int(k.split("/")[1]) for k in rows[-1] if k.startswith("client/") and k.endswith("/V")]
    masses = []
    for cid in last:
        P = kept[cid]["kept_P"]
        present = P.sum(1) > 0
        masses.append(float(P[present][:, ~present].sum(1).mean()))
    assert rows[-1]["test/absent_mass"] == pytest.approx(sum(masses) / len(masses), rel=1e-6)


@pytest.mark.parametrize("method", ["fedavg", "fedprox", "local"])
def test_every_method_reports_the_diagnostics(out, method):
    r = read_metrics(run(out, f"method.name={method}", "trainer.rounds=1", name=method))[-1]
    assert 0 <= r["test/adaptability"] <= 1 and r["test/kl_PQ"] > 0
    assert len([k for k in r if k.endswith("/kl_PQ") and k.startswith("client/")]) == 3
    if method == "local":  # no global model: no global accuracy
        assert "test/acc_global_balanced" not in r and "test/acc_global_client_dist" not in r
    else:
        assert 0 <= r["test/acc_global_balanced"] <= 1 and 0 <= r["test/acc_global_client_dist"] <= 1


@on_one_and_two_processes("fedacd", "method.name=fedacd", "trainer.rounds=2", "evaluators.adaptability.every=1",
                          "data.num_clients=7", "model.norm=batch")
def fedacd_same_on_one_and_two_processes(one: Path, two: Path) -> None:
    a, b = read_metrics(one), read_metrics(two)
    assert all("test/adaptability" in r and "test/acc_global_balanced" in r for r in a)
    assert_same_rows(a, b, abs=1e-6)


def test_bad_fedacd_options_are_config_errors(out, capsys):
    assert main(tiny(out, "method.name=fedacd", "method.p_update=epoch")) == 2
    err = capsys.readouterr().err
    assert "method.p_update" in err and "prev_epoch" in err
    assert main(tiny(out, "method.name=fedacd_base", "method.aggregation=v")) == 2
    assert "method.aggregation" in capsys.readouterr().err
    assert not (out / "outputs").exists()


def test_tinyimagenet_config_runs_on_fabricated_files(out):
    """The real ResNet-18 (BatchNorm) config end to end on a tiny fake tiny-imagenet-200/ tree."""
    from tests import fakes

    fakes.tinyimagenet(out / "data", per_class=8, n_val=6)
    args = ["conf=fedacd_tinyimagenet", f"data.root={out / 'data'}", f"logger.output_dir={out / 'outputs'}",
            "logger.run_name=tiny", "logger.wandb.mode=disabled", "logger.progress=false", "fabric.cpu_threads=1",
            "data.num_clients=2", "data.partition.min_client_size=1", "trainer.rounds=1", "trainer.local_epochs=1",
            "trainer.participation=1.0", "trainer.batch_size=4"]
    assert main(args) == 0
    r = read_metrics(out / "outputs" / "tiny")[-1]
    assert {"test/acc_global_balanced", "test/adaptability", "server/V_mean", "client/0/kl_PQ"} <= r.keys()


@pytest.mark.parametrize("p_update", ["batch", "prev_epoch"])
def test_training_step_loss_by_hand(out, p_update):
    """Without mixup, one training step's loss is L1 + lam * L2 with A from this batch's per-class mean
    probabilities (batch) or from the clean pass of the received model (prev_epoch, first epoch)."""
    cfg = load_config(tiny(out, "method.name=fedacd", "method.mixup=false", f"method.p_update={p_update}",
                           "method.lam=0.7", "method.missing_delta=0.01"))
    torch.set_num_threads(1)
    orch = orchestrator(cfg, out / "run")
    data = orch.data
    m = orch.load_client(0, 1)
    m.train()
    m.on_local_train_start()
    train = data.clients[1].train
    x, y = m.make_batch(train, torch.arange(min(16, len(train))))
    out_step = m.training_step((x, y), 0)
    with torch.no_grad():
        logits = m(x).double()
        probs = logits.softmax(1)
        C = data.num_classes
        present = torch.bincount(train.y, minlength=C) > 0
        if p_update == "batch":
            P = m._clean_P().double()  # rows absent from the batch keep the initial P
            for k in y.unique():
                P[k] = probs[y == k].mean(0)
        else:
            m.eval()
            P = torch.stack([logits.new_zeros(C)] * C)
            allx, ally = m.make_batch(train, torch.arange(len(train)))
            allp = m(allx).double().softmax(1)
            for k in ally.unique():
                P[k] = allp[ally == k].mean(0)
        A = torch.zeros(C, C, dtype=torch.float64)
        for a in range(C):
            for b in range(C):
                if a != b:
                    A[a, b] = (math.log(max(P[a, b], 1e-8)) - math.log(max(P[b, a], 1e-8)) if present[b]
                               else math.log(0.01))
        l1 = l1_direct(probs, y).mean()
        l2 = F.cross_entropy(logits + A[y], y)
    assert float(out_step["l1"]) == pytest.approx(float(l1), rel=1e-4, abs=1e-6)
    assert float(out_step["l2"]) == pytest.approx(float(l2), rel=1e-4)
    assert float(out_step["loss"].detach()) == pytest.approx(float(l1 + 0.7 * l2), rel=1e-4)


def test_clean_p_source_averages_the_unmixed_batch_in_eval_mode(out):
    """p_source=clean with mixup: P's rows for the batch's classes are the eval-mode softmax of the unmixed batch,
    averaged per true class (p_update=batch); the clean pass leaves the BatchNorm statistics to the training pass."""
    torch.set_num_threads(1)
    after = {}
    for source in ("clean", "mixed"):
        cfg = load_config(tiny(out, "method.name=fedacd", f"method.p_source={source}", "method.p_update=batch",
                               "model.norm=batch"))
        orch = orchestrator(cfg, out / source)
        m = orch.load_client(0, 1)
        m.train()
        m.on_local_train_start()
        train = orch.data.clients[1].train
        x, y = m.make_batch(train, torch.arange(min(16, len(train))))
        m.eval()
        with torch.no_grad():
            probs = m(x).double().softmax(1)
        m.train()
        m.training_step((x, y), 0)
        assert m.training  # the clean pass puts the model back in training mode
        fits = [torch.allclose(m.P[k], probs[y == k].mean(0), atol=1e-6) for k in y.unique()]
        assert all(fits) if source == "clean" else not any(fits)
        after[source] = {k: v.clone() for k, v in m.model.state_dict().items() if "running" in k}
    assert after["clean"].keys() and all(torch.equal(after["clean"][k], after["mixed"][k]) for k in after["clean"])
