"""FedACD's losses and statistics as pure tensor functions (Zhou et al. 2025, Eqs. 7-11); KL(P || Q) of Eq. 10
is fl/metrics/adaptability.py's, which every method reports.

Notation: C classes; P is a client's C x C matrix of mean predicted probabilities per true class
(row i = true class i, P_ij = mean p_j(x) over local samples of class i); `present` marks the classes
the client holds (N_i > 0). Every function works on a batch and returns per-sample values where the
paper averages over samples, so mixup can weight them.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from fl.core.label_sums import class_sums


def l1_flatten(logp: Tensor, y: Tensor) -> Tensor:
    """Eq. 7 per sample: KL(p || q) with q_y = p_y and q_k = (1 - p_y) / (C - 1) off the target.

    The y term is zero, so L1 = sum_{k != y} p_k (log p_k - log q_off). log(1 - p_y) is taken as the
    logsumexp of the off-target log-probabilities, which stays finite as p_y -> 1. q is a function of
    p, but detaching it would not change the gradient (the softmax Jacobian cancels the constant
    log q_off), so it is left attached."""
    C = logp.shape[1]
    if C < 2:
        return logp.new_zeros(logp.shape[0])
    target = F.one_hot(y, C).bool()
    log1m_py = torch.logsumexp(logp.masked_fill(target, -math.inf), dim=1)
    log_q_off = log1m_py - math.log(C - 1)
    terms = logp.exp() * (logp - log_q_off[:, None])
    return terms.masked_fill(target, 0.0).sum(1)


def adjustment_matrix(P: Tensor, present: Tensor, missing_delta: float, eps: float = 1e-8) -> Tensor:
    """A[y, i] = log P_yi - log P_iy (row = true class), the logit adjustment of Eq. 8, detached.

    Columns of classes the client lacks get log(missing_delta) (their Delta is "a small value"), which
    takes them (almost) out of the softmax denominator; the diagonal is zero. Rows of missing classes
    are never used (labels are local) and are left as computed."""
    logP = P.detach().clamp_min(eps).log()
    A = logP - logP.T
    A[:, ~present] = math.log(missing_delta)
    A.fill_diagonal_(0.0)
    return A


def l2_adjusted_ce(logits: Tensor, y: Tensor, A: Tensor) -> Tensor:
    """Eq. 8 per sample: log(1 + sum_{i != y} exp(f_i - f_y + A[y, i])) = CE(f + A[y], y)."""
    return F.cross_entropy(logits + A.to(logits.dtype)[y], y, reduction="none")


def accumulate(sums: Tensor, weights: Tensor, probs: Tensor, y: Tensor, w) -> None:
    """Add detached probabilities to their class rows with weight w (mixup's mu or 1 - mu), in place.
    class_sums adds every sample of a label (P[y] += p would keep only one of them), in the same order on every run
    (index_add_'s atomics on CUDA do not)."""
    w = torch.as_tensor(w, dtype=sums.dtype, device=sums.device)
    w = w.expand(len(y)) if w.dim() == 0 else w
    sums += class_sums(probs.detach().to(sums.dtype) * w[:, None], y, sums.shape[0]).to(sums.dtype)
    weights += class_sums(w, y, weights.shape[0]).to(weights.dtype)


def rows_from(sums: Tensor, weights: Tensor, previous: Tensor) -> Tensor:
    """P from accumulated sums: rows with weight take their weighted mean, others keep `previous`."""
    has = weights > 0
    out = previous.clone()
    out[has] = (sums[has] / weights[has, None]).to(out.dtype)
    return out


def score_v(kl: Tensor | float) -> float:
    """V = sigmoid(1 / KL(P || Q)) in (0.5, 1]; KL -> 0 gives V -> 1 (guarded at 1e-12)."""
    kl = float(kl)
    return float(torch.sigmoid(torch.tensor(1.0 / max(kl, 1e-12), dtype=torch.float64)))


def v_weights(scores: list[float]) -> Tensor:
    """Eq. 11's aggregation weights V_m / sum_k V_k over the round's clients."""
    v = torch.tensor(scores, dtype=torch.float64)
    return v / v.sum()
