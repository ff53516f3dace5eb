"""FedMosaic's math (Sec. 3 and Algorithm 1), as pure functions: the adaptive weight lambda, the client loss,
the confidence scores E (variants W and U), DP noise on E, the server's confidence-weighted vote and
the check of what a client may send.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

UNCERTAINTY_SCORES = ("norm_neg_entropy", "inv_entropy", "margin", "max_prob")


def adaptive_lambda(l_priv: Tensor, l_pseudo: Tensor, eps: float = 1e-8) -> Tensor:
    """lambda = exp(-(l_pseudo - l_priv) / l_priv), in (0, e]. Detached: the paper holds lambda fixed during
    the optimization step (proof of Prop. 1); a gradient through it would push l_priv up to lower lambda.
    The denominator is clamped so an overfit client (l_priv -> 0) gets lambda -> 0, not NaN."""
    l_priv, l_pseudo = l_priv.detach(), l_pseudo.detach()
    return torch.exp(-(l_pseudo - l_priv) / l_priv.clamp_min(eps))


def cotraining_loss(logits_priv: Tensor, y: Tensor, logits_pub: Optional[Tensor], pseudo: Optional[Tensor],
                    lam_fn) -> tuple[Tensor, Tensor, Optional[Tensor], Optional[Tensor]]:
    """l = l_priv + lambda * l_pseudo (Alg. 1 lines 4-7). Without pseudo-labels yet (P = {}), l = l_priv.
    `lam_fn(l_priv, l_pseudo)` returns a constant (detached) lambda. Returns (loss, l_priv, l_pseudo, lambda)."""
    l_priv = F.cross_entropy(logits_priv, y)
    if logits_pub is None:
        return l_priv, l_priv, None, None
    l_pseudo = F.cross_entropy(logits_pub, pseudo)
    lam = lam_fn(l_priv, l_pseudo)
    return l_priv + lam * l_pseudo, l_priv, l_pseudo, lam


# ---- confidence E (client side) ----------------------------------------------------------------------
def class_frequencies(labels: Tensor, num_classes: int) -> Tensor:
    """n_i(y) / |D_i| from the client's training labels (fixed; never from its predictions)."""
    counts = torch.bincount(labels.cpu(), minlength=num_classes).double()
    return counts / counts.sum().clamp_min(1)


def confidence_w(preds: Tensor, freq: Tensor, eps: float = 1e-6) -> Tensor:
    """Variant W: the relative frequency of the predicted class in the local training data, floored at eps
    so classes the client never saw still break ties by majority (Sec. 3 and Algorithm 1, line 12 require
    E > 0 but give no rule for a predicted class absent from the local data)."""
    return freq.to(preds.device)[preds.long()].clamp_min(eps).float()


def confidence_u(probs: Tensor, score: str = "norm_neg_entropy", eps: float = 1e-6) -> Tensor:
    """Variant U: a certainty score of the softmax p (higher = more certain). The paper gives no formula;
    norm_neg_entropy = 1 - H(p)/log C is bounded in (0, 1], which DP calibration needs."""
    p = probs.double()
    if score in ("norm_neg_entropy", "inv_entropy"):
        h = -(p * torch.log(p.clamp_min(1e-30))).sum(1)
        e = 1.0 - h / math.log(p.shape[1]) if score == "norm_neg_entropy" else 1.0 / (h + 1e-6)
    elif score == "margin":
        top = p.topk(2, dim=1).values
        e = top[:, 0] - top[:, 1]
    elif score == "max_prob":
        e = p.max(1).values
    else:
        raise ValueError(f"unknown uncertainty score {score!r}; choices: {', '.join(UNCERTAINTY_SCORES)}")
    return e.clamp_min(eps).float()


def dp_noise(conf: Tensor, sigma: float, gen: torch.Generator, mechanism: str = "gaussian", clip: float = 1.0,
             eps: float = 1e-6) -> Tensor:
    """DP-FedMosaic (Sec. 3, "Privacy considerations": "calibrated noise is added to the expertise scores";
    the paper gives no mechanism or noise scale): clip E to [0, clip], add independent noise per entry, floor
    at eps. Only E is perturbed; the hard labels are sent as they are. sigma = 0 returns E unchanged."""
    if sigma == 0:
        return conf
    c = conf.double().cpu().clamp(0.0, clip)
    if mechanism == "gaussian":
        noise = torch.randn(c.shape, generator=gen, dtype=torch.float64) * sigma
    else:  # laplace with scale sigma, by inverse CDF from a seeded uniform
        u = torch.rand(c.shape, generator=gen, dtype=torch.float64) - 0.5
        noise = -sigma * torch.sign(u) * torch.log1p(-2 * u.abs())
    return (c + noise).clamp_min(eps).to(conf.dtype).to(conf.device)


# ---- the server's vote -------------------------------------------------------------------------------
def vote_scores(preds: list[Tensor], confs: list[Tensor], num_classes: int) -> Tensor:
    """S = sum_i diag(E_i) onehot(L_i), summed in float64 in the given (client) order."""
    n = preds[0].shape[0]
    s = torch.zeros(n, num_classes, dtype=torch.float64)
    rows = torch.arange(n)
    for p, e in zip(preds, confs):
        s.index_put_((rows, p.long().cpu()), e.double().cpu(), accumulate=True)
    return s


def consensus(scores: Tensor, tie_break: str = "lowest", gen: Optional[torch.Generator] = None) -> Tensor:
    """L[j] = argmax_c S[j, c]; ties go to the lowest class index, or to a seeded random one among the tied."""
    if tie_break == "lowest":
        return scores.argmax(1)  # torch returns the first maximal index
    top = scores == scores.max(1, keepdim=True).values
    noise = torch.rand(scores.shape, generator=gen, dtype=torch.float64)
    return torch.where(top, noise, torch.full_like(noise, -1.0)).argmax(1)


def check_upload(message: dict, public_size: int, num_classes: int, cid: int) -> tuple[Tensor, Tensor]:
    """The privacy contract: a client sends hard labels (integers in [0, C)) and one positive, finite score
    per public example, nothing else (no softmax vectors, logits or parameters)."""
    where = f"FedMosaic client {cid}"
    if set(message) != {"pred", "conf"}:
        raise ValueError(f"{where} sent {sorted(message)}; only 'pred' and 'conf' may be sent")
    pred, conf = message["pred"], message["conf"]
    if pred.is_floating_point() or pred.shape != (public_size,):
        raise ValueError(f"{where}: 'pred' must be integer class indices of shape ({public_size},), "
                         f"got {pred.dtype} {tuple(pred.shape)}")
    if pred.numel() and (int(pred.min()) < 0 or int(pred.max()) >= num_classes):
        raise ValueError(f"{where}: 'pred' has classes outside [0, {num_classes})")
    if not conf.is_floating_point() or conf.shape != (public_size,):
        raise ValueError(f"{where}: 'conf' must be one float per public example, shape ({public_size},), "
                         f"got {conf.dtype} {tuple(conf.shape)}")
    if not bool(torch.isfinite(conf).all()) or not bool((conf > 0).all()):
        raise ValueError(f"{where}: 'conf' must be positive and finite")
    return pred, conf


def label_dtype(num_classes: int) -> torch.dtype:
    """The smallest integer type for class indices, so the logged communication is what would travel."""
    return torch.uint8 if num_classes <= 256 else torch.int16 if num_classes <= 32768 else torch.int32
