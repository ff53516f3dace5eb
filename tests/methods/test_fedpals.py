"""FedPALS: the QP against the spec's closed forms and anchors, and the method end to end."""
import math

import numpy as np
import pytest
import torch

from fl.methods.fedpals.qp import ess, fedpals_weights, lambda_for_ess, mismatch
from fl.run.train import main
from tests.helpers import global_params, read_metrics

S2 = np.array([[0.5, 0.5, 0.0], [0.5, 0.0, 0.5]])  # the paper's synthetic clients
N2 = np.array([40, 18])
T_HALF = np.array([0.25, 0.375, 0.375])  # T_delta at delta = 0.5


def random_instance(rng, M=6, K=4):
    return rng.dirichlet(np.ones(K), M), rng.dirichlet(np.ones(K)), rng.integers(10, 500, M)


def test_weights_lie_on_the_simplex():
    rng = np.random.default_rng(0)
    for _ in range(5):
        S, T, n = random_instance(rng)
        for lam in (0, 1e-2, 1, 1e2, 1e4, 1e6):
            a = fedpals_weights(S, T, n, lam)
            assert len(a) == len(n) and (a >= 0).all() and abs(a.sum() - 1) < 1e-6


def test_ess_bounds():
    rng = np.random.default_rng(1)
    n = rng.integers(5, 100, 7).astype(float)
    for _ in range(20):
        a = rng.dirichlet(np.ones(7))
        assert n.min() - 1e-9 <= ess(a, n) <= n.sum() + 1e-9
    assert ess(n / n.sum(), n) == pytest.approx(n.sum())
    assert ess(np.eye(7)[3], n) == pytest.approx(n[3])


def test_large_lambda_gives_fedavg_weights():
    np.testing.assert_allclose(fedpals_weights(S2, T_HALF, N2, 1e9), [40 / 58, 18 / 58], atol=1e-6)
    np.testing.assert_allclose(fedpals_weights(S2, T_HALF, N2, math.inf), [40 / 58, 18 / 58], atol=0)


def test_target_at_fedavg_mixture_gives_fedavg_for_every_lambda_including_lexicographic_zero():
    rng = np.random.default_rng(2)
    S, _, n = random_instance(rng, M=6, K=4)
    T = (n / n.sum()) @ S
    for lam in (0, 1, 100, 1e4):
        np.testing.assert_allclose(fedpals_weights(S, T, n, lam), n / n.sum(), atol=1e-5)


def test_exact_coverage_and_the_lexicographic_limit():
    np.testing.assert_allclose(fedpals_weights(np.eye(3), [0.2, 0.3, 0.5], [100, 100, 100], 0), [0.2, 0.3, 0.5],
                               atol=1e-7)
    S = np.array([[1, 0], [1, 0], [0, 1], [0, 1.0]])
    n = [10, 30, 20, 20]
    a = fedpals_weights(S, [0.3, 0.7], n, 0)
    np.testing.assert_allclose(a, [0.075, 0.225, 0.35, 0.35], atol=1e-6)  # not the tiny-lambda answer
    assert ess(a, n) == pytest.approx(1 / 0.0145, rel=1e-5)


@pytest.mark.parametrize("lam, a1, ess_value", [(0, 0.5, 49.6552), (1, 0.526316, 51.5714), (10, 0.617021, 56.6047),
                                                (40, 0.664179, 57.8247), (100, 0.678571, 57.9667)])
def test_two_client_anchors(lam, a1, ess_value):
    a = fedpals_weights(S2, T_HALF, N2, lam)
    closed = (0.25 + lam / 18) / (0.5 + lam / 40 + lam / 18) if lam else 0.5
    assert a[0] == pytest.approx(a1, abs=1e-5) and a[0] == pytest.approx(closed, abs=1e-6)
    assert ess(a, N2) == pytest.approx(ess_value, abs=1e-3)


def test_projection_distance_and_bisection_anchors():
    for delta in (0.5, 1.0):
        T = (1 - delta) * np.array([0.5, 0.25, 0.25]) + delta * np.array([0, 0.5, 0.5])
        assert mismatch(fedpals_weights(S2, T, N2, 0), S2, T) == pytest.approx(0.375 * delta ** 2, abs=1e-7)
    for frac, lam in ((0.9, 1.4266), (0.95, 4.884), (0.99, 19.11)):
        assert lambda_for_ess(S2, T_HALF, N2, frac) == pytest.approx(lam, rel=1e-3)
    assert lambda_for_ess(S2, T_HALF, N2, 0.5) == 0.0  # below the lam=0 ESS (85.6%)
    assert lambda_for_ess(S2, T_HALF, N2, 1.0) == math.inf


def test_interior_kkt_closed_form():
    rng = np.random.default_rng(3)
    S, T, n, lam = rng.dirichlet(np.full(8, 3.0), 5), rng.dirichlet(np.full(8, 3.0)), rng.integers(100, 1000, 5), 50.0
    A = S @ S.T + lam * np.diag(1.0 / n)
    b = S @ T
    Ai1, Aib = np.linalg.solve(A, np.ones(5)), np.linalg.solve(A, b)
    nu = (1 - Aib.sum()) / Ai1.sum()
    closed = Aib + nu * Ai1
    assert (closed > 0).all()  # interior instance
    np.testing.assert_allclose(fedpals_weights(S, T, n, lam), closed, atol=1e-7)


def test_ess_and_mismatch_are_nondecreasing_in_lambda():
    rng = np.random.default_rng(4)
    S, T, n = random_instance(rng, M=8, K=5)
    sols = [fedpals_weights(S, T, n, lam) for lam in (0, 1, 10, 100, 1e3, 1e4, 1e5)]
    e = [ess(a, n) for a in sols]
    f = [mismatch(a, S, T) for a in sols]
    assert all(y >= x - 1e-6 for x, y in zip(e, e[1:])) and all(y >= x - 1e-8 for x, y in zip(f, f[1:]))


def test_permutation_equivariance_and_a_singular_instance():
    rng = np.random.default_rng(5)
    S, T, n = random_instance(rng, M=5, K=4)
    perm = rng.permutation(5)
    np.testing.assert_allclose(fedpals_weights(S[perm], T, n[perm], 30.0), fedpals_weights(S, T, n, 30.0)[perm],
                               atol=1e-6)
    S_dup = np.vstack([S[:2], S[:2], S[:1]])  # duplicated rows: S S^T is singular
    for lam in (0, 5.0):
        a = fedpals_weights(S_dup, T, [10, 20, 30, 40, 50], lam)
        assert (a >= 0).all() and abs(a.sum() - 1) < 1e-6


# ---- the method end to end ------------------------------------------------------------------------
def synth(out, *extra):
    return ["conf=fedpals_synthetic", "logger.wandb.mode=disabled", "logger.progress=false", "trainer.rounds=4",
            "trainer.eval_every=2", f"logger.output_dir={out / 'outputs'}", f"data.root={out / 'data'}", *extra]


def test_fedpals_synthetic_logs_the_papers_weights(out):
    assert main(synth(out, "logger.run_name=p")) == 0
    last = read_metrics(out / "outputs" / "p")[-1]
    assert last["server/alpha/0"] == pytest.approx(0.5, abs=1e-6)
    assert last["server/ess"] == pytest.approx(49.6552, abs=1e-3)
    assert last["server/projection_distance"] == pytest.approx(0.09375, abs=1e-7)
    assert {"test/target_acc", "test/target_f1", "val/target_acc"} <= last.keys()


def test_ess_fraction_one_equals_fedavg(out):
    assert main(synth(out, "method.lam=null", "method.ess_frac=1.0", "logger.run_name=p")) == 0
    assert main(synth(out, "method.name=fedavg", "logger.run_name=a")) == 0
    p, a = read_metrics(out / "outputs" / "p"), read_metrics(out / "outputs" / "a")
    for rp, ra in zip(p, a):
        for k in ra:
            if k.startswith("test/"):
                assert rp[k] == pytest.approx(ra[k], abs=1e-6), k
    gp, ga = (global_params(out / "outputs" / d) for d in "pa")
    for k in ga:
        torch.testing.assert_close(gp[k], ga[k], atol=1e-6, rtol=0)


def test_partial_participation_resolves_per_round(out):
    args = ["method.name=fedpals", "data.num_clients=6", "data.target.distribution=partition",
            "data.partition.name=classes",
            "data.partition.classes_per_client=3", "data.embedded.samples_per_class=60", "trainer.participation=0.5",
            "trainer.rounds=3", "model.width=4", "logger.wandb.mode=disabled", "logger.progress=false",
            f"logger.output_dir={out / 'outputs'}", f"data.root={out / 'data'}", "logger.run_name=pp"]
    assert main(args) == 0
    for row in read_metrics(out / "outputs" / "pp"):
        trained = {k.split("/")[1] for k in row if k.startswith("client/") and k.endswith("/loss")}
        alphas = {k.split("/")[2]: v for k, v in row.items() if k.startswith("server/alpha/")}
        assert alphas.keys() == trained and abs(sum(alphas.values()) - 1) < 1e-6


def test_fedpals_needs_a_target(out, capsys):
    assert main(synth(out, "data.target.distribution=null")) == 2
    assert "data.target" in capsys.readouterr().err
    assert main(synth(out, "data.target.distribution=[0.5,0.6,0.1]")) == 2
    assert "sum" in capsys.readouterr().err


# ---- lam = 0 on the boundary of the clients' hull --------------------------------------------------------
def vertices(K: int = 4) -> np.ndarray:
    """Client marginals with clearly separated vertices: each client mostly one class."""
    return 0.7 * np.eye(K) + 0.3 / K


def test_target_equal_to_a_clients_marginal_gives_that_client_alone():
    """T = S_j for an extreme client j: the only exact match is alpha = e_j (the lam -> 0+ limit), whatever the
    other clients' sizes; an interior-point first stage ~1e-9 inside the hull used to spread weight."""
    S, n = vertices(), np.array([50.0, 900.0, 400.0, 700.0])
    for j in range(4):
        np.testing.assert_allclose(fedpals_weights(S, S[j], n, 0.0), np.eye(4)[j], atol=1e-6)


def test_duplicated_extreme_clients_share_the_weight_in_proportion_to_their_sizes():
    """S_0 = S_1 and T = S_0: every split of the weight between them matches T exactly; the largest ESS splits
    it n_0 : n_1 (minimising a_0^2/n_0 + a_1^2/n_1 on a_0 + a_1 = 1)."""
    S = np.vstack([vertices()[:1], vertices()])
    n = np.array([30.0, 90.0, 400.0, 500.0, 600.0])
    np.testing.assert_allclose(fedpals_weights(S, S[0], n, 0.0), [0.25, 0.75, 0, 0, 0], atol=1e-6)


def test_target_outside_the_hull_beyond_a_vertex_projects_onto_it():
    """T beyond the vertex S_0 (outside the hull): the projection is S_0 itself, the face holding it is {0}."""
    S, n = vertices(), np.array([50.0, 900.0, 400.0, 700.0])
    T = np.array([1.0, 0.0, 0.0, 0.0])
    np.testing.assert_allclose(fedpals_weights(S, T, n, 0.0), [1, 0, 0, 0], atol=1e-6)


def test_lam_zero_is_the_limit_of_small_lam_on_random_boundary_cases():
    """On random problems whose target is a client's marginal (possibly duplicated) or lies beyond it, lam = 0
    agrees with lam -> 0+ (here 1e-3 in sample-count units) and matches T at least as well. Clients are kept
    apart (the lam -> 0 limit is reached only once lam << n ||S_k - S_j||^2, which near-duplicates defeat)."""
    rng = np.random.default_rng(7)
    for trial in range(30):
        K = int(rng.integers(3, 7))
        M = int(rng.integers(2, K + 1))  # distinct dominant classes: no near-duplicate clients (see below)
        S = 0.8 * np.eye(K)[rng.permutation(K)[:M]] + 0.2 * rng.dirichlet(np.ones(K), M)
        if trial % 2:
            S[1] = S[0]
        n = rng.integers(10, 500, M).astype(float)
        T = S[0] if trial % 3 else np.clip(S[0] + 0.2 * (S[0] - S.mean(0)), 0, None)
        T = T / T.sum()
        exact, small = fedpals_weights(S, T, n, 0.0), fedpals_weights(S, T, n, 1e-3)
        np.testing.assert_allclose(exact, small, atol=2e-3, err_msg=str(trial))
        assert mismatch(exact, S, T) <= mismatch(small, S, T) + 1e-8


def test_a_lam_sweep_reuses_one_compiled_problem():
    """FedPALSQP compiles Eq. 7 once with lambda as a parameter; its solutions equal fresh solves."""
    from fl.methods.fedpals.qp import FedPALSQP

    rng = np.random.default_rng(3)
    S, T, n = rng.dirichlet(np.ones(5), 6), rng.dirichlet(np.ones(5)), rng.integers(20, 300, 6).astype(float)
    qp = FedPALSQP(S, T, n)
    for lam in (0.5, 5.0, 50.0, 500.0):
        np.testing.assert_allclose(qp.weights(lam), fedpals_weights(S, T, n, lam), atol=1e-7)
