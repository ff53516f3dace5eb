"""pFedFDA's statistics: the Gaussian (LDA) head, local estimates, their interpolation and the choice of beta.

Everything here runs in float64, outside autocast (with n_i << d the covariances are nearly singular, and
low-precision solves are unreliable); callers cast W, b to the model's dtype only when writing the head.
Equation numbers are the paper's (McLaughlin & Su, NeurIPS 2024).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from fl.core.label_sums import class_sums

PRIOR_EPS = 1e-4  # log-priors of absent classes stay finite (official code)


def priors(labels: Tensor, num_classes: int, eps: float = PRIOR_EPS) -> Tensor:
    """pi^c = n^c / n, smoothed: (pi + eps) / sum(pi + eps)."""
    pi = torch.bincount(labels.long().cpu(), minlength=num_classes).double()
    pi = pi / pi.sum().clamp_min(1.0) + eps
    return pi / pi.sum()


def shrink(cov: Tensor, eps: float) -> Tensor:
    """(1 - eps) Sigma + eps tr(Sigma)/d I: the solve-time shrinkage that keeps Sigma well conditioned."""
    d = cov.shape[-1]
    eye = torch.eye(d, dtype=cov.dtype, device=cov.device)
    return (1 - eps) * cov + eps * torch.diagonal(cov, dim1=-2, dim2=-1).sum(-1)[..., None, None] / d * eye


def lda_head(mu: Tensor, cov: Tensor, log_prior: Tensor, shrink_eps: float = 1e-4) -> tuple[Tensor, Tensor]:
    """Eq. 4 as a linear layer: W_c = Sigma^-1 mu_c (a solve, never an explicit inverse),
    b_c = -1/2 mu_c . W_c + log pi_c. softmax(z W^T + b) is the Gaussian posterior p(y | z)."""
    s = shrink(cov, shrink_eps) if shrink_eps > 0 else cov
    W = torch.linalg.solve(s, mu.T).T
    b = -0.5 * (mu * W).sum(1) + log_prior
    return W, b


def nearest_pd_clipped(cov: Tensor, threshold: float = 1e-15, std_floor: float = 0.0) -> Tensor:
    """The nearest positive (semi)definite matrix with the same variances (statsmodels' cov_nearest, method
    'clipped'): clip the eigenvalues of the correlation matrix at `threshold`, rescale it to unit diagonal
    and turn it back into a covariance. A matrix with no eigenvalue below the threshold comes back unchanged.
    `std_floor` guards dead features (zero variance, e.g. post-ReLU units that never fire on a small client)
    against 0/0; the official code's +I hides that case."""
    cov = (cov + cov.T) / 2
    std = torch.diagonal(cov).clamp_min(0).sqrt().clamp_min(std_floor)
    corr = cov / std[:, None] / std[None, :]
    eye = torch.eye(cov.shape[0], dtype=cov.dtype, device=cov.device)
    if int(torch.linalg.cholesky_ex(corr - threshold * eye).info) == 0:
        return cov  # every eigenvalue above the threshold (a Cholesky is far cheaper than eigh)
    evals, evecs = torch.linalg.eigh(corr)
    if bool((evals >= threshold).all()):
        return cov
    corr = (evecs * evals.clamp_min(threshold)) @ evecs.T
    d = torch.diagonal(corr).sqrt()
    corr = corr / d[:, None] / d[None, :]
    return corr * std[:, None] * std[None, :]


def regularise(cov: Tensor, mode: str, eps: float = 1e-4) -> Tensor:
    """Covariance regularisation for low-sample estimates (Sec. 4.3 vs the official code).
    code:  Sigma + eps (every entry) + I, then the nearest PD matrix (a no-op: +I already makes it PD)
    paper: Sigma + eps I, then the nearest PD matrix with identical variances"""
    d = cov.shape[0]
    eye = torch.eye(d, dtype=cov.dtype, device=cov.device)
    if mode == "code":
        return nearest_pd_clipped(cov + eps + eye)
    return nearest_pd_clipped(cov + eps * eye, std_floor=math.sqrt(eps))


def estimate(z: Tensor, y: Tensor, fallback_mu: Tensor, cov_reg: str, min_count: int = 0,
             eps: float = 1e-4) -> tuple[Tensor, Tensor]:
    """Eq. 6-8: class means and the tied (pooled within-class) covariance with an (n - 1) denominator.
    Classes with at most `min_count` samples (absent ones always) take the global mean; centring always uses
    the local mean of every present class."""
    C = fallback_mu.shape[0]
    counts = torch.bincount(y, minlength=C)
    sums = class_sums(z, y, C).to(fallback_mu.dtype)  # deterministic on CUDA, where index_add_ is not
    local = sums / counts.clamp_min(1)[:, None].to(z.dtype)
    centred = z - local[y]
    cov = centred.T @ centred / max(z.shape[0] - 1, 1)
    mu = torch.where((counts > min_count)[:, None], local, fallback_mu)
    return mu, regularise(cov, cov_reg, eps)


def interpolate(beta_mu, beta_cov, local: tuple[Tensor, Tensor], glob: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """Eq. 9: mu_i = b mu_hat + (1 - b) mu_g, Sigma_i = b' Sigma_hat + (1 - b') Sigma_g."""
    return (beta_mu * local[0] + (1 - beta_mu) * glob[0], beta_cov * local[1] + (1 - beta_cov) * glob[1])


def stratified_folds(y: Tensor, k: int, gen: torch.Generator) -> list[Tensor]:
    """k folds with every class spread evenly: shuffle within each class, sort by class, deal round-robin
    (the allocation of scikit-learn's shuffled StratifiedKFold, drawn from a seeded generator)."""
    order = []
    for c in torch.unique(y).tolist():
        idx = torch.nonzero(y == c).flatten()
        order.append(idx[torch.randperm(len(idx), generator=gen).to(idx.device)])
    order = torch.cat(order)
    fold_of = torch.arange(len(order), device=y.device) % k
    return [order[fold_of == f] for f in range(k)]


@dataclass
class BetaResult:
    beta_mu: float
    beta_cov: float
    fallback: bool  # the CV split or the optimiser failed (beta = 0, resp. the previous beta)
    cv_loss: float = float("nan")


def cv_parts(z: Tensor, y: Tensor, glob: tuple[Tensor, Tensor], k: int, cov_reg: str,
             gen: torch.Generator, cov_eps: float = 1e-4) -> list[tuple[tuple[Tensor, Tensor], Tensor, Tensor]]:
    """Per fold: the local statistics of its training part (Eq. 6-8, global-mean fallback) and its held-out
    features and labels."""
    folds = stratified_folds(y, k, gen)
    parts = []
    for f in range(k):
        train = torch.cat([folds[g] for g in range(k) if g != f])
        parts.append((estimate(z[train], y[train], glob[0], cov_reg, eps=cov_eps), z[folds[f]], y[folds[f]]))
    return parts


def cv_objective(parts, glob: tuple[Tensor, Tensor], log_prior: Tensor, shrink_eps: float):
    """J(beta_mu, beta_cov) = sum over folds of the mean held-out cross-entropy of the LDA head of the
    interpolated statistics (Eq. 9 in the official code's scaling), for tensors of betas of any one shape at once
    (one value per pair, same shape; autograd passes through).

    The shrunk covariance is affine in beta: A + beta B with A = shrink(Sigma_g) (PD) and
    B = shrink(Sigma_hat) - A. With A = L L^T and L^-1 B L^-T = Q diag(lam) Q^T (one Cholesky and one symmetric
    eigendecomposition per fold), (A + beta B)^-1 = P^T diag(1 / (1 + beta lam)) P, P = Q^T L^-1. So every
    evaluation of J, and its gradient, costs O(n C d) instead of a d x d solve; it equals the direct solve
    (tested), and 1 + beta lam > 0 on [0, 1] because A + beta B is a convex combination of PD matrices."""
    mu_g = glob[0]
    A = shrink(glob[1], shrink_eps)
    L = torch.linalg.cholesky(A)
    terms = []
    for (mu_hat, cov_hat), zv, yv in parts:
        B = shrink(cov_hat, shrink_eps) - A
        LiB = torch.linalg.solve_triangular(L, B, upper=False)  # L^-1 B
        K = torch.linalg.solve_triangular(L, LiB.T, upper=False)  # L^-1 B L^-T (B symmetric)
        lam, Q = torch.linalg.eigh((K + K.T) / 2)
        P = torch.linalg.solve_triangular(L.T, Q, upper=True).T  # Q^T L^-1
        terms.append((lam, zv @ P.T, mu_g @ P.T, (mu_hat - mu_g) @ P.T, yv))

    def J(beta_mu: Tensor, beta_cov: Tensor) -> Tensor:
        """J at each pair (beta_mu[i], beta_cov[i]), as a tensor of their shape: no value is read on the host."""
        values = []
        for bm, bc in zip(beta_mu.reshape(-1), beta_cov.reshape(-1)):
            # pair by pair with one expression: batching the pairs changes J in its last bits (batched and single
            # small matrix products, the loss's reduction), and that is enough to move the chosen beta by 1e-7
            total = 0.0
            for lam, zp, m0, m1, yv in terms:
                s = 1.0 / (1.0 + bc * lam)
                m = m0 + bm * m1
                logits = (zp * s) @ m.T - 0.5 * (m * m * s).sum(1) + log_prior
                total = total + F.cross_entropy(logits, yv)  # mean per fold, summed over folds (code)
            values.append(total)
        return torch.stack(values).view(beta_mu.shape)

    return J


GOLDEN = (math.sqrt(5) - 1) / 2


def golden_section(f: Callable[[Tensor], Tensor], lo: Tensor, hi: Tensor, tol: float,
                   width: float) -> tuple[Tensor, Tensor]:
    """Golden-section search for a minimum of f on [lo, hi] (0-dim tensors, hi - lo <= width): (argument, value)
    to within tol, as tensors. The bracket shrinks by GOLDEN per step, so the steps to reach tol are known in
    advance: each runs on the device whatever the comparisons, and changes nothing once the bracket is within tol
    (a classic `while hi - lo > tol` loop would read every comparison on the host)."""
    steps = max(0, math.ceil(math.log(tol / width) / math.log(GOLDEN))) + 3  # +3: rounding of the bracket
    c, d = hi - GOLDEN * (hi - lo), lo + GOLDEN * (hi - lo)
    fc, fd = f(c), f(d)
    for _ in range(steps):
        active, left = hi - lo > tol, fc <= fd  # left: the minimum is in [lo, d]; else in [c, hi]
        new_lo, new_hi = torch.where(left, lo, c), torch.where(left, d, hi)
        probe = torch.where(left, new_hi - GOLDEN * (new_hi - new_lo), new_lo + GOLDEN * (new_hi - new_lo))
        f_probe = f(probe)
        new = (new_lo, new_hi, torch.where(left, probe, d), torch.where(left, c, probe),
               torch.where(left, f_probe, fd), torch.where(left, fc, f_probe))
        lo, hi, c, d, fc, fd = (torch.where(active, n, o) for n, o in zip(new, (lo, hi, c, d, fc, fd)))
    return torch.where(fc <= fd, c, d), torch.minimum(fc, fd)


def bounded_min(f: Callable[[Tensor], Tensor], dims: int, device=None, tol: float = 1e-7) -> tuple[Tensor, Tensor]:
    """The minimum of f over [0, 1]^dims (dims 1 or 2; f maps points [G, dims] to values [G], float64): the best point
    of a uniform grid (21 points, resp. 11 x 11, given to f in one call), refined by golden-section search on each
    coordinate within one grid step of it (in 2-D, coordinate by coordinate until the point stops moving).
    Non-finite values count as +inf, so the search cannot fail; returns (point [dims], value) as tensors on
    `device`, value = inf when f is nowhere finite. Nothing is read on the host but, in 2-D, whether a sweep moved
    the point."""
    def value(points: Tensor) -> Tensor:
        v = f(points)
        return torch.where(torch.isfinite(v), v, math.inf)

    n = 21 if dims == 1 else 11
    step = 1 / (n - 1)
    axis = torch.arange(n, dtype=torch.float64, device=device) / (n - 1)
    grid = axis.view(-1, 1) if dims == 1 else torch.cartesian_prod(axis, axis)
    values = value(grid)
    best = torch.argmin(values).view(1)  # the first of equal minima
    point, fbest = grid.index_select(0, best)[0], values.index_select(0, best)[0]
    for _ in range(1 if dims == 1 else 8):  # in 2-D: coordinate sweeps until the point stops moving
        moved = torch.zeros((), dtype=torch.float64, device=device)
        for i in range(dims):
            def along(t: Tensor, i=i, base=point) -> Tensor:
                return value(torch.cat([base[:i], t.view(1), base[i + 1:]]).view(1, -1))[0]

            lo, hi = (point[i] - step).clamp(min=0.0), (point[i] + step).clamp(max=1.0)
            t, ft = golden_section(along, lo, hi, tol, 2 * step)
            better = ft < fbest  # the bracket's ends are grid points already seen: keep the best value
            moved = torch.where(better, torch.maximum(moved, (t - point[i]).abs()), moved)
            point = torch.where(better, torch.cat([point[:i], t.view(1), point[i + 1:]]), point)
            fbest = torch.where(better, ft, fbest)
        if dims > 1 and bool(moved < 10 * tol):  # one read per sweep
            break
    return point, fbest


def solve_beta(z: Tensor, y: Tensor, glob: tuple[Tensor, Tensor], log_prior: Tensor, *, mode: str, k: int,
               cov_reg: str, shrink_eps: float, max_iter: int, gtol: float, gen: torch.Generator,
               prev: Optional[tuple[float, float]] = None, init: float = 0.5, solver: str = "bounded",
               cov_eps: float = 1e-4) -> BetaResult:
    """Eq. 9: beta minimising the k-fold cross-validated cross-entropy of the interpolated LDA head (the official
    code's objective) over [0, 1] (one beta, or beta_mu and beta_cov in separate mode).
    solver: bounded = `bounded_min`, the exact minimiser up to 1e-7 on any input; lbfgs = the official code's
    L-BFGS from `init` with beta clipped to [0, 1] inside the objective, which can fail (a strong-Wolfe line
    search on a diverged feature bank raises IndexError) or return a non-finite loss: then the bounded search
    is used and the result is marked as a fallback.
    mode: single (one beta for means and covariance), separate (beta_mu, beta_cov), local_only (beta = 1).
    The result is always finite and in [0, 1]."""
    if mode == "local_only":
        return BetaResult(1.0, 1.0, False)
    prev = prev if prev is not None else (init, init)
    counts = torch.bincount(y)
    keep = counts[y] >= k  # classes with fewer than k samples stay out of the CV (not out of the final MLE)
    z, y = z[keep], y[keep]
    if z.shape[0] < k:
        return BetaResult(0.0, 0.0, True)  # the code's CV-failure path: global statistics only
    dims = 1 if mode == "single" else 2
    try:
        J = cv_objective(cv_parts(z, y, glob, k, cov_reg, gen, cov_eps), glob, log_prior, shrink_eps)
    except RuntimeError:  # a failed factorisation of the global covariance: keep the previous beta (code)
        return BetaResult(prev[0], prev[1], True)

    fallback = False
    if solver == "lbfgs":
        try:
            b, loss = _lbfgs(J, dims, init, max_iter, gtol, z.device)
            if math.isfinite(loss):
                return BetaResult(b[0], b[-1], False, loss)
        except (RuntimeError, IndexError, ValueError):  # the line search's failures on degenerate banks
            pass
        fallback = True
    with torch.no_grad():
        point, loss = bounded_min(lambda b: J(b[:, 0], b[:, -1]), dims, z.device)
        *b, loss = torch.cat([point, loss.view(1)]).tolist()  # the search's one transfer to the host
    if not math.isfinite(loss):  # the objective is nowhere finite: keep the previous beta
        return BetaResult(prev[0], prev[1], True)
    return BetaResult(b[0], b[-1], fallback, loss)


def _lbfgs(J, dims: int, init: float, max_iter: int, gtol: float, device) -> tuple[tuple[float, ...], float]:
    """The official code's search: L-BFGS (strong Wolfe) from `init`, beta clipped to [0, 1] in the objective."""
    x = torch.full((dims,), init, dtype=torch.float64, device=device, requires_grad=True)
    opt = torch.optim.LBFGS([x], lr=1.0, max_iter=max_iter, tolerance_grad=gtol, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        b = x.clamp(0.0, 1.0)
        loss = J(b[0], b[-1])
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        b = x.detach().clamp(0.0, 1.0)
        return tuple(float(v) for v in b), float(J(b[0], b[-1]))
