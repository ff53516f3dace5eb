"""FedPAC's classifier-collaboration weights (Xu, Tong & Huang, ICLR 2023, Sec. 4.3) as a cvxpy QP.

Client j sends, computed with the received global feature extractor on its training data (n_j samples,
label shares pi_j(k), class feature means mu_jk):

    h_j[k] = pi_j(k) * mu_jk                       (= E[z 1{y=k}], one row per class)
    V_j    = (1/n_j) sum_k [ pi_j(k) E||z||^2|y=k - pi_j(k)^2 ||mu_jk||^2 ]   (variance of the estimate of h_j)

The combined head of client i is sum_j alpha_ij phi_j, with alpha_i on the simplex minimising the estimated
test loss of client i, a bias term plus a variance term:

    alpha_i = argmin_{alpha >= 0, sum alpha = 1}  || sum_j alpha_j (h_i - h_j) ||^2 + sum_j alpha_j^2 V_j

Both terms are convex (a sum of squares and a nonnegative diagonal), so the QP is solved as written, with no
eigenvalue clipping. With two clients it has the closed form alpha_i2 = V_1 / (V_1 + V_2 + ||h_1 - h_2||^2)
for client 1.
"""
from __future__ import annotations

import numpy as np

from fl.methods.simplex_qp import SOLVERS, solve_simplex  # noqa: F401  (SOLVERS: the configs' choices)

# optima often sit on a face of the simplex; the default gaps leave ~1e-5 on weights that should be 0
OPTIONS = {"CLARABEL": {"tol_gap_abs": 1e-10, "tol_gap_rel": 1e-10, "tol_feas": 1e-10}}


def combination_weights(h: np.ndarray, v: np.ndarray, i: int, solver: str = "CLARABEL") -> np.ndarray:
    """alpha_i for client (row) i. h: (M, D) flattened statistics h_j; v: (M,) variances V_j >= 0."""
    import cvxpy as cp  # loads with the first solve, not with the method

    h, v = np.asarray(h, dtype=float), np.clip(np.asarray(v, dtype=float), 0.0, None)
    m = len(v)
    if m == 1:
        return np.ones(1)
    diff = (h[i][None, :] - h).T  # (D, M): column j is h_i - h_j
    scale = float((diff ** 2).sum() + v.sum())
    if scale <= 0.0:  # every client identical and noiseless: any alpha is optimal; keep the own head
        return np.eye(m)[i]
    p = (diff.T @ diff + np.diag(v)) / scale  # (M, M) Gram matrix plus a nonnegative diagonal: PSD
    p = 0.5 * (p + p.T)
    a = cp.Variable(m, nonneg=True)
    problem = cp.Problem(cp.Minimize(cp.quad_form(a, cp.psd_wrap(p))), [cp.sum(a) == 1])
    return solve_simplex(problem, a, solver, "FedPAC QP", OPTIONS)
