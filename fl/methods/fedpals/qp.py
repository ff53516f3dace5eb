"""FedPALS' aggregation weights (Listo Zec et al., eq. 7) as a cvxpy QP, the effective sample size, and
the lambda that reaches a target ESS fraction.

    alpha = argmin_{alpha in simplex} ||T - sum_i alpha_i S_i||^2 + lam * sum_i alpha_i^2 / n_i

lam is in the paper's units (raw sample counts). lam = 0 is solved lexicographically: the exact
match (projection of T onto conv(S)) with the largest ESS, since a tiny lam is numerically not that limit.
The problem is compiled once per set of clients with lambda as a parameter (FedPALSQP).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

import numpy as np

from fl.methods.simplex_qp import SOLVERS, solve_simplex  # noqa: F401  (SOLVERS: the configs' choices)

if TYPE_CHECKING:
    import cvxpy as cp


def ess(alpha: np.ndarray, n: np.ndarray) -> float:
    """Kong's effective sample size 1 / sum_i alpha_i^2 / n_i: N at FedAvg weights, n_j at alpha = e_j."""
    return float(1.0 / np.sum(np.asarray(alpha, float) ** 2 / np.asarray(n, float)))


def mismatch(alpha: np.ndarray, S: np.ndarray, T: np.ndarray) -> float:
    """||alpha^T S - T||^2: the label-marginal mismatch of the aggregate."""
    return float(np.sum((np.asarray(alpha) @ np.asarray(S) - np.asarray(T)) ** 2))


def _solve(problem: cp.Problem, variable: cp.Variable, solver: str) -> np.ndarray:
    return solve_simplex(problem, variable, solver, "FedPALS QP")


class FedPALSQP:
    """Eq. 7 for one set of clients, built once with lambda as a cvxpy Parameter: solving it for many lambdas
    (the ESS bisection) re-uses the compiled problem."""

    def __init__(self, S, T, n, solver: str = "CLARABEL"):
        import cvxpy as cp  # loads with the first solve, not with the method

        self.S, self.T, self.n = (np.asarray(v, dtype=float) for v in (S, T, n))
        self.solver = solver
        M, N = len(self.n), self.n.sum()
        self.a = cp.Variable(M, nonneg=True)
        self.lam = cp.Parameter(nonneg=True)
        self.fit = cp.sum_squares(self.S.T @ self.a - self.T)
        self.inv_ess = cp.sum(cp.multiply(N / self.n, cp.square(self.a)))  # = N sum a^2 / n, scaled for conditioning
        self.problem = cp.Problem(cp.Minimize(self.fit + (self.lam / N) * self.inv_ess), [cp.sum(self.a) == 1])
        self._exact: Optional[np.ndarray] = None

    def weights(self, lam: float) -> np.ndarray:
        if math.isinf(lam):
            return self.n / self.n.sum()
        if lam == 0:
            if self._exact is None:
                self._exact = self._lexicographic()
            return self._exact
        self.lam.value = float(lam)
        return _solve(self.problem, self.a, self.solver)

    def lambda_for_ess(self, frac: float, lo: float = 1e-6, hi: float = 1e8, iters: int = 60) -> float:
        """Smallest lam whose weights reach ESS >= frac * N, by bisection on log lam (ESS is nondecreasing in
        lam). frac at or below the lam = 0 ESS gives 0; frac = 1 is reached only in the limit (FedAvg): inf."""
        n = self.n
        N = n.sum()
        if ess(self.weights(0.0), n) / N >= frac:
            return 0.0
        if frac >= 1.0:
            return math.inf
        if ess(self.weights(hi), n) / N < frac:
            return hi
        lo_log, hi_log = math.log(lo), math.log(hi)
        for _ in range(iters):
            mid = 0.5 * (lo_log + hi_log)
            if ess(self.weights(math.exp(mid)), n) / N >= frac:
                hi_log = mid
            else:
                lo_log = mid
            if hi_log - lo_log < 1e-6:
                break
        return math.exp(hi_log)

    def _lexicographic(self) -> np.ndarray:
        """lam = 0 as the lam -> 0+ limit: among the best matches of T, the one with the largest ESS. The best
        matches all give the projection p* of T onto conv(S) (unique), so the second stage keeps the mismatch at
        its minimum exactly: it matches T itself when T is in the hull, and otherwise p* using only the clients on
        the hull's face that holds p* (those whose gradient S_k . (p* - T) is minimal, by the KKT conditions).
        Matching the first stage's own p* over every client instead lets an interior-point solution ~1e-9 inside
        the hull put weight on clients off that face."""
        import cvxpy as cp  # loads with the first solve, not with the method

        S, T, a = self.S, self.T, self.a
        self.lam.value = 0.0
        first = _solve(self.problem, a, self.solver)
        p_star = first @ S
        stages = []
        if float(np.sum((p_star - T) ** 2)) <= 1e-6:  # T may be in the hull (the first stage is accurate to ~1e-9)
            stages.append([cp.sum(a) == 1, S.T @ a == T])
        g = S @ (p_star - T)  # KKT: the clients that can carry weight in a best match have the smallest gradient
        on_face = g <= g.min() + 1e-6 * (1.0 + np.abs(g).max())
        stages.append([cp.sum(a) == 1, S.T @ a == p_star] + ([a[np.flatnonzero(~on_face)] == 0] if not on_face.all()
                                                              else []))
        best_fit = mismatch(first, S, T)
        for constraints in stages:
            try:
                alpha = _solve(cp.Problem(cp.Minimize(self.inv_ess), constraints), a, self.solver)
            except RuntimeError:  # numerically infeasible (T just outside the hull): the next stage
                continue
            if mismatch(alpha, S, T) <= best_fit + 1e-8:  # still a best match (an inaccurate solve may not be)
                return alpha
        return first


def fedpals_weights(S, T, n, lam: float, solver: str = "CLARABEL") -> np.ndarray:
    """S: (M, K) client label marginals; T: (K,) target marginal; n: (M,) sample counts; lam >= 0."""
    return FedPALSQP(S, T, n, solver).weights(lam)


def lambda_for_ess(S, T, n, frac: float, solver: str = "CLARABEL", lo: float = 1e-6, hi: float = 1e8,
                   iters: int = 60) -> float:
    """Smallest lam whose weights reach ESS >= frac * N (FedPALSQP.lambda_for_ess)."""
    return FedPALSQP(S, T, n, solver).lambda_for_ess(frac, lo, hi, iters)
