"""FedPALS' aggregation weights (Listo Zec et al., eq. 7) as a cvxpy QP, the effective sample size, and
the lambda that reaches a target ESS fraction.

    alpha = argmin_{alpha in simplex} ||T - sum_i alpha_i S_i||^2 + lam * sum_i alpha_i^2 / n_i

lam is in the paper's units (raw sample counts). lam = 0 is solved lexicographically: the exact
match (projection of T onto conv(S)) with the largest ESS, since a tiny lam is numerically not that limit.
"""
from __future__ import annotations

import math

import cvxpy as cp
import numpy as np

from fl.methods.simplex_qp import SOLVERS, solve_simplex  # noqa: F401  (SOLVERS: the configs' choices)


def ess(alpha: np.ndarray, n: np.ndarray) -> float:
    """Kong's effective sample size 1 / sum_i alpha_i^2 / n_i: N at FedAvg weights, n_j at alpha = e_j."""
    return float(1.0 / np.sum(np.asarray(alpha, float) ** 2 / np.asarray(n, float)))


def mismatch(alpha: np.ndarray, S: np.ndarray, T: np.ndarray) -> float:
    """||alpha^T S - T||^2: the label-marginal mismatch of the aggregate."""
    return float(np.sum((np.asarray(alpha) @ np.asarray(S) - np.asarray(T)) ** 2))


def _solve(problem: cp.Problem, variable: cp.Variable, solver: str) -> np.ndarray:
    return solve_simplex(problem, variable, solver, "FedPALS QP")


def fedpals_weights(S, T, n, lam: float, solver: str = "CLARABEL") -> np.ndarray:
    """S: (M, K) client label marginals; T: (K,) target marginal; n: (M,) sample counts; lam >= 0."""
    S, T, n = (np.asarray(v, dtype=float) for v in (S, T, n))
    M, N = len(n), n.sum()
    if math.isinf(lam):
        return n / N
    a = cp.Variable(M, nonneg=True)
    fit = cp.sum_squares(S.T @ a - T)
    inv_ess = cp.sum(cp.multiply(N / n, cp.square(a)))  # = N * sum a^2 / n, scaled for conditioning
    if lam > 0:
        return _solve(cp.Problem(cp.Minimize(fit + (lam / N) * inv_ess), [cp.sum(a) == 1]), a, solver)
    # lam = 0: stage 1 finds the projection p* of T onto conv(S); stage 2 the largest-ESS alpha reaching it
    first = _solve(cp.Problem(cp.Minimize(fit), [cp.sum(a) == 1]), a, solver)
    p_star = first @ S
    stage2 = cp.Problem(cp.Minimize(inv_ess), [cp.sum(a) == 1, S.T @ a == p_star])
    try:
        return _solve(stage2, a, solver)
    except RuntimeError:
        return first


def lambda_for_ess(S, T, n, frac: float, solver: str = "CLARABEL", lo: float = 1e-6, hi: float = 1e8,
                   iters: int = 60) -> float:
    """Smallest lam whose weights reach ESS >= frac * N, by bisection on log lam (ESS is nondecreasing in
    lam). frac at or below the lam = 0 ESS gives 0; frac = 1 is reached only in the limit (FedAvg): inf."""
    n = np.asarray(n, dtype=float)
    N = n.sum()
    if ess(fedpals_weights(S, T, n, 0.0, solver), n) / N >= frac:
        return 0.0
    if frac >= 1.0:
        return math.inf
    if ess(fedpals_weights(S, T, n, hi, solver), n) / N < frac:
        return hi
    lo_log, hi_log = math.log(lo), math.log(hi)
    for _ in range(iters):
        mid = 0.5 * (lo_log + hi_log)
        if ess(fedpals_weights(S, T, n, math.exp(mid), solver), n) / N >= frac:
            hi_log = mid
        else:
            lo_log = mid
        if hi_log - lo_log < 1e-6:
            break
    return math.exp(hi_log)
