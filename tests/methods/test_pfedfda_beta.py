"""pFedFDA's beta search (Eq. 9) never stops a run and returns a finite beta in [0, 1] for every input.

tests/data/pfedfda_beta_linesearch_fail.pt holds the inputs of one solve_beta call from a real run whose local
training had diverged (features ~1e14, covariance ~1e42): the official code's L-BFGS raised IndexError in its
strong-Wolfe line search on 11 of 50 fold seeds.
"""
import math
from pathlib import Path

import pytest
import torch

from bench.host_stalls import host_bounded_min
from fl.methods.pfedfda.stats import bounded_min, cv_objective, cv_parts, estimate, solve_beta
from tests.helpers import TorchCalls

FIXTURE = Path(__file__).parents[1] / "data" / "pfedfda_beta_linesearch_fail.pt"


@pytest.fixture(autouse=True)
def one_thread():
    """Small matrices: one intra-op thread is fastest and unaffected by a busy machine (conftest restores it)."""
    torch.set_num_threads(1)


def objective(z, y, mu, cov, lp, seed, cov_reg="paper", k=2):
    keep = torch.bincount(y)[y] >= k
    parts = cv_parts(z[keep], y[keep], (mu, cov), k, cov_reg, torch.Generator().manual_seed(seed))
    J = cv_objective(parts, (mu, cov), lp, 1e-4)
    return lambda bm, bc: float(J(torch.tensor(bm, dtype=torch.float64), torch.tensor(bc, dtype=torch.float64)))


@pytest.mark.parametrize("mode", ["single", "separate"])
def test_the_line_search_failure_of_a_diverged_run_falls_back_and_the_bounded_search_never_fails(mode):
    case = torch.load(FIXTURE, weights_only=False)
    z, y, mu, cov, lp, kw = (case[k] for k in ("z", "y", "mu", "cov", "lp", "kw"))
    kw = {**kw, "mode": mode}
    fallbacks = 0
    for seed in range(0, 50, 3 if mode == "separate" else 1):
        lbfgs = solve_beta(z, y, (mu, cov), lp, gen=torch.Generator().manual_seed(seed), solver="lbfgs", **kw)
        bounded = solve_beta(z, y, (mu, cov), lp, gen=torch.Generator().manual_seed(seed), solver="bounded", **kw)
        for r in (lbfgs, bounded):
            assert 0.0 <= r.beta_mu <= 1.0 and 0.0 <= r.beta_cov <= 1.0 and math.isfinite(r.cv_loss)
        assert not bounded.fallback
        fallbacks += lbfgs.fallback
        # the bounded search is the minimiser: never worse than where L-BFGS stopped
        assert bounded.cv_loss <= lbfgs.cv_loss + 1e-9
    assert fallbacks > 0  # the official solver does fail on this input; the fallback took over


def on_points(f):
    """A function of (b) or (b, c) as bounded_min takes it: points [G, dims] -> values [G]."""
    return lambda points: torch.stack([torch.tensor(float(f(*p)), dtype=torch.float64) for p in points.tolist()])


def test_bounded_min_finds_interior_boundary_and_two_dimensional_minima():
    (b,), v = bounded_min(on_points(lambda b: (b - 0.3123) ** 2), 1)
    assert b == pytest.approx(0.3123, abs=1e-6) and v < 1e-11
    (b,), _ = bounded_min(on_points(lambda b: b), 1)
    assert b == 0.0
    (b,), _ = bounded_min(on_points(lambda b: -b), 1)
    assert b == 1.0
    (b, c), _ = bounded_min(on_points(lambda b, c: (b - 0.2) ** 2 + 3 * (c - 0.905) ** 2
                                      + 0.5 * (b - 0.2) * (c - 0.905)), 2)
    assert (b, c) == (pytest.approx(0.2, abs=1e-5), pytest.approx(0.905, abs=1e-5))
    # non-finite values count as +inf: the minimum over the finite part
    (b,), v = bounded_min(on_points(lambda b: (b - 0.7) ** 2 if b <= 0.5 else math.nan), 1)
    assert b == pytest.approx(0.5, abs=1e-6) and v == pytest.approx(0.04, abs=1e-6)
    assert bounded_min(on_points(lambda b: math.inf), 1)[1] == math.inf


# ---- the search as it was: every evaluation of J read on the host (a GPU sync each): bench/host_stalls.py's
def host_search(z, y, glob, lp, seed, mode, cov_reg, k=2):
    keep = torch.bincount(y)[y] >= k
    parts = cv_parts(z[keep], y[keep], glob, k, cov_reg, torch.Generator().manual_seed(seed))
    J = cv_objective(parts, glob, lp, 1e-4)
    f = lambda *b: float(J(torch.tensor(b[0], dtype=torch.float64), torch.tensor(b[-1], dtype=torch.float64)))  # noqa: E731
    return host_bounded_min(f, 1 if mode == "single" else 2)


def test_the_beta_search_chooses_the_beta_the_host_driven_search_chose():
    """The same grid and golden-section steps, decided on the device: the same beta, bit for bit, on a diverged
    run's statistics and on degenerate banks (J evaluated pair by pair, as before)."""
    case = torch.load(FIXTURE, weights_only=False)
    z, y, mu, cov, lp, kw = (case[k] for k in ("z", "y", "mu", "cov", "lp", "kw"))
    problems = [(z, y, mu, cov, lp, seed, mode, kw["cov_reg"]) for mode in ("single", "separate")
                for seed in range(0, 12, 1 if mode == "single" else 4)]
    rng = torch.Generator().manual_seed(2024)
    for trial in range(40):
        bank = random_bank(rng, trial)
        problems += [(*bank, trial, mode, ("code", "paper")[trial % 2]) for mode in ("single", "separate")]
    for z, y, mu, cov, lp, seed, mode, cov_reg in problems:
        r = solve_beta(z, y, (mu, cov), lp, mode=mode, k=2, cov_reg=cov_reg, shrink_eps=1e-4, max_iter=10, gtol=1e-3,
                       gen=torch.Generator().manual_seed(seed))
        if r.fallback:  # the CV split failed before any search
            continue
        point, loss = host_search(z, y, (mu, cov), lp, seed, mode, cov_reg)
        assert (r.beta_mu, r.beta_cov) == (point[0], point[-1]) and r.cv_loss == loss, (seed, mode)


def test_the_beta_search_reads_nothing_from_the_device_but_one_flag_per_two_dimensional_sweep():
    """Tens to hundreds of evaluations per solve, each read as a Python float before: now one read per solve (the
    result), plus in 2-D whether a coordinate sweep moved the point."""
    case = torch.load(FIXTURE, weights_only=False)
    z, y, mu, cov, lp = (case[k] for k in ("z", "y", "mu", "cov", "lp"))
    J = cv_objective(cv_parts(z, y, (mu, cov), 2, "paper", torch.Generator().manual_seed(0)), (mu, cov), lp, 1e-4)
    for dims in (1, 2):
        with TorchCalls() as calls, torch.no_grad():
            bounded_min(lambda b: J(b[:, 0], b[:, -1]), dims)
        reads = [name for name, _ in calls.host_reads]
        assert reads == [] if dims == 1 else (set(reads) == {"__bool__"} and len(reads) <= 8)


def test_nowhere_finite_objective_keeps_the_previous_beta():
    torch.manual_seed(0)
    z, y = torch.full((8, 3), math.inf, dtype=torch.float64), torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    mu, cov = torch.zeros(2, 3, dtype=torch.float64), torch.eye(3, dtype=torch.float64)
    r = solve_beta(z, y, (mu, cov), torch.zeros(2, dtype=torch.float64), mode="single", k=2, cov_reg="code",
                   shrink_eps=1e-4, max_iter=10, gtol=1e-3, gen=torch.Generator().manual_seed(0), prev=(0.3, 0.3))
    assert (r.beta_mu, r.beta_cov, r.fallback) == (0.3, 0.3, True)


def random_bank(rng: torch.Generator, trial: int):
    """A small or degenerate feature bank: few samples, absent classes, rank-deficient covariance (more features
    than samples, duplicated and dead features), scales from 1e-6 to 1e14."""
    C = int(torch.randint(2, 7, (1,), generator=rng))
    d = int(torch.randint(3, 41, (1,), generator=rng))
    n = int(torch.randint(2, 13, (1,), generator=rng))
    present = torch.randperm(C, generator=rng)[: max(1, int(torch.randint(1, C + 1, (1,), generator=rng)))]
    y = present[torch.randint(0, len(present), (n,), generator=rng)]
    scale = 10.0 ** float(torch.randint(-6, 15, (1,), generator=rng))
    z = torch.randn(n, d, generator=rng, dtype=torch.float64) * scale
    if trial % 3 == 0:
        z[:, d // 2:] = z[:, :1]  # duplicated features
    if trial % 4 == 1:
        z[:, 0] = 0.0  # a dead feature
    mu = torch.rand(C, d, generator=rng, dtype=torch.float64)
    cov = torch.eye(d, dtype=torch.float64) * (10.0 ** float(torch.randint(-4, 5, (1,), generator=rng)))
    return z, y, mu, cov, torch.log(torch.full((C,), 1.0 / C, dtype=torch.float64))


@pytest.mark.parametrize("solver", ["bounded", "lbfgs"])
def test_degenerate_feature_banks_always_give_a_finite_beta_in_the_unit_interval(solver):
    rng = torch.Generator().manual_seed(2024)
    for trial in range(40):
        z, y, mu, cov, lp = random_bank(rng, trial)
        for mode in ("single", "separate"):
            r = solve_beta(z, y, (mu, cov), lp, mode=mode, k=2, cov_reg=("code", "paper")[trial % 2],
                           shrink_eps=1e-4, max_iter=10, gtol=1e-3, gen=torch.Generator().manual_seed(trial),
                           solver=solver)
            assert 0.0 <= r.beta_mu <= 1.0 and 0.0 <= r.beta_cov <= 1.0, (trial, mode, r)


def test_cov_eps_reaches_the_regularisation():
    g = torch.Generator().manual_seed(0)
    z, y = torch.randn(30, 4, generator=g, dtype=torch.float64), torch.arange(30) % 3
    mu = torch.zeros(3, 4, dtype=torch.float64)
    _, small = estimate(z, y, mu, "paper", eps=1e-4)
    _, large = estimate(z, y, mu, "paper", eps=0.5)
    torch.testing.assert_close(large - small, (0.5 - 1e-4) * torch.eye(4, dtype=torch.float64))


def test_collapsed_personal_heads_are_counted_and_warned_about(out):
    """A personal head that puts all of its client's (multi-class) samples in one class is flagged per client,
    counted in test/collapsed_heads and warned about (here: tiny, barely trained features)."""
    from tests.helpers import read_metrics, run_tiny

    with pytest.warns(UserWarning, match=r"personal heads predict one class .*\(method.cov_reg=code: its added"):
        run_dir = run_tiny(out, "method.name=pfedfda", "trainer.rounds=1", "trainer.evaluators=[]", name="collapse")
    row = read_metrics(run_dir)[-1]
    flags = [row[f"client/{c}/head_collapsed"] for c in range(6)]
    assert set(flags) <= {0.0, 1.0} and row["test/collapsed_heads"] == sum(flags) > 0


@pytest.mark.parametrize("cov_reg", ["code", "paper"])
def test_the_collapse_warning_names_the_regularisation_in_use_not_the_other(cov_reg):
    from types import SimpleNamespace

    from fl.config import load_config
    from fl.methods.pfedfda import COLLAPSE_CAUSES, PFedFDAServer

    server = PFedFDAServer(load_config(["method.name=pfedfda", f"method.cov_reg={cov_reg}"]))
    server.data = SimpleNamespace(num_clients=2)
    ctx = SimpleNamespace(round=4, fabric=SimpleNamespace(is_global_zero=True), log_histogram=lambda *a: None)
    metrics = {"client/0/beta_eval": 1.0, "client/1/beta_eval": 1.0, "client/0/head_collapsed": 1.0,
               "client/1/head_collapsed": 0.0}
    with pytest.warns(UserWarning) as caught:
        server.on_evaluate(ctx, metrics)
    message = str(caught[0].message)
    other = next(k for k in COLLAPSE_CAUSES if k != cov_reg)
    assert message.startswith("pFedFDA, round 5: 1 of 2 personal heads predict one class")
    assert message.endswith(f"(method.cov_reg={cov_reg}: {COLLAPSE_CAUSES[cov_reg]})")
    assert COLLAPSE_CAUSES[other] not in message and metrics["test/collapsed_heads"] == 1.0
