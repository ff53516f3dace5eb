"""ConFREE (Zheng, Hu, Yang, Zheng, Xu & Wang, AAAI 2025, "ConFREE: Conflict-free Client Update Aggregation for
Personalized Federated Learning"): the server aggregates the clients' updates of the shared parameters so that no
client's update is pushed against by another's, then moves the result towards the worst-served client.

Clients (the paper's Algorithm 1, lines 4-6, which is FedRep's schedule): the personal head h_i is trained on the
received shared parameters theta_g, then the shared parameters with the new head fixed; the client's update is
Delta_i = theta_i - theta_g. Here that is FedRep's client (fl/methods/fedrep.py): the first `head_steps` optimizer
steps train the head only, the rest the body; the head never leaves the client.

Server, with the N updates of the round (Algorithm 1, lines 8-14):

    Stage 1, the conflict-free guidance vector (Eq. 3): every update loses its components along the updates it
    conflicts with (negative cosine), each projection onto the normal plane of an original update,
        Delta_perp = (1/N) sum_i [ Delta_i - sum_{j != i, Delta_i . Delta_j < 0} (Delta_i . Delta_j / ||Delta_j||^2)
                                   Delta_j ]
    Stage 2, the worst client near the guidance vector (Eq. 4): d* = argmax_d min_j d . Delta_j subject to
        ||d - Delta_perp|| <= c ||Delta_perp||, solved through its dual (Eq. 5): with Delta_w = sum_j w_j Delta_j,
        w* = argmin_{w in simplex} Delta_perp . Delta_w + c ||Delta_perp|| ||Delta_w||,
        d* = Delta_perp + c ||Delta_perp|| Delta_w* / ||Delta_w*||
    Aggregation (line 14): theta_g <- theta_g + d*.

How it maps onto this framework:
- Each client uploads its trained shared parameters theta_i as FedRep does; the server's `aggregate` hook gets every
  upload (`needs_every_upload`, gathered in client order) and forms Delta_i = theta_i - theta_g in float64. Buffers
  (none under GroupNorm) take the uploads' weighted mean.
- Everything the server needs is the N x N Gram matrix of the updates: Delta_perp and d* are combinations
  sum_j gamma_j Delta_j, and the new model is sum_j gamma_j theta_j + (1 - sum_j gamma_j) theta_g, summed in float64
  in client order like the orchestrator's mean, so with c = 0, sample weights and no conflict it is FedRep's
  average bit for bit.
- w* is found by cvxpy (CLARABEL, a second-order cone problem over the N weights; the paper uses SciPy's minimize);
  the clients it keeps then give d* exactly (`polish`: they share the worst improvement, d* is on the ball's
  boundary), falling back on the solver's w* when that fails the optimality conditions.
- Eq. 3 projects against the original updates, all at once, so no order is involved (the authors' code projects
  sequentially, PCGrad-style, against the other clients in a random order); nothing here is random.
- Where the paper is silent: when ||Delta_w*|| = 0 (the updates' hull contains 0) d* is undefined and
  d* = Delta_perp is used; the paper states c in (0, 1) but not the value it ran (c = 0.5 in the configs).
  With one client Algorithm 1 as written moves theta_g by (1 + c) Delta_1; kept.
- Equation and line numbers are those of the authors' public poster and slides (the proceedings text was not
  available here).
- Options for the released code and for FedDRM's ConFREE baseline: `weighting=samples` weights Eq. 3 by n_i
  instead of 1/N (FedDRM's code, which also has no Stage 2: it is c = 0, weighting=samples); `rescale=true`
  divides d* by 1 + c^2 (the authors' code); `scope=layer` applies both stages to each parameter tensor
  separately (the authors' code), `scope=model` to the whole shared model as one vector (the paper).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch
from torch import Tensor

from fl.config import param
from fl.core import ClientModule, Server, Upload, register_method
from fl.core.aggregation import Uploads
from fl.core.metric_directions import NEITHER
from fl.methods.fedrep import FedRepClient, FedRepConfig
from fl.methods.fedrep import resolve as fedrep_resolve
from fl.methods.simplex_qp import SOLVERS, solve_simplex

# w* often sits on a face of the simplex; tight gaps keep the zero weights at zero
OPTIONS = {"CLARABEL": {"tol_gap_abs": 1e-10, "tol_gap_rel": 1e-10, "tol_feas": 1e-10}}
DEGENERATE = 1e-6  # ||Delta_w*|| below this fraction of the largest ||Delta_j||: 0 is in the updates' hull


@dataclass
class ConFREEConfig(FedRepConfig):
    name: str = "confree"
    c: float = param(0.5, ge=0.0, lt=1.0, search={"values": [0.0, 0.1, 0.3, 0.5, 0.7, 0.9]},
                     help="c: radius of the ball around the guidance vector, ||d - Delta_perp|| <= c ||Delta_perp|| "
                     "(Eq. 4; the paper's range (0, 1)); 0 = the guidance vector itself (Stage 1 only)")
    weighting: str = param("uniform", choices=["uniform", "samples"],
                           help="weights of the guidance vector (and of buffers): uniform = 1/N (Eq. 3), "
                           "samples = n_i (FedDRM's ConFREE baseline)")
    rescale: bool = param(False, help="divide d* by 1 + c^2, as the authors' code does; the paper adds d* as is")
    scope: str = param("model", choices=["model", "layer"],
                       help="model: the shared parameters as one vector (the paper); layer: each parameter tensor "
                       "on its own (the authors' code)")
    solver: str = param("CLARABEL", choices=list(SOLVERS), help="cvxpy solver of the dual problem for w* (Eq. 5)")


def update_keys(module: ClientModule) -> list[str]:
    """The parameters ConFREE aggregates: shared, trainable, floating point (buffers take the plain mean)."""
    return [k for k, p in module.named_parameters()
            if p.requires_grad and p.is_floating_point() and not module.is_private(k)]


def worst_client_weights(gram: np.ndarray, guide: np.ndarray, norm: float, c: float,
                         solver: str = "CLARABEL") -> np.ndarray:
    """w* of Eq. 5 on the simplex: argmin_w Delta_perp . Delta_w + c ||Delta_perp|| ||Delta_w||, from the Gram matrix
    G_ij = Delta_i . Delta_j, guide_j = Delta_j . Delta_perp and norm = ||Delta_perp|| (scaled to order 1 first)."""
    import cvxpy as cp  # loads with the first solve, not with the method

    n = len(guide)
    if n == 1:
        return np.ones(1)
    scale = float(np.max(np.diag(gram)))
    lam, q = np.linalg.eigh(gram / scale)
    root = np.sqrt(np.clip(lam, 0.0, None))[:, None] * q.T  # root.T @ root = G / scale
    w = cp.Variable(n, nonneg=True)
    objective = (guide / (norm * math.sqrt(scale))) @ w + c * cp.norm(root @ w, 2)
    return solve_simplex(cp.Problem(cp.Minimize(objective), [cp.sum(w) == 1]), w, solver, "ConFREE's dual (Eq. 5)",
                         OPTIONS)


def polish(gram: np.ndarray, guide: np.ndarray, radius: float, w: np.ndarray) -> Optional[np.ndarray]:
    """d* - Delta_perp = sum_j v_j Delta_j exactly, from the clients the solver's w* keeps (S = {j: w*_j > 0}): by
    complementary slackness they share the worst improvement t (Delta_j . d* = t) and d* is on the ball's boundary,
    v = kappa w* on S, so v_S = G_SS^-1 (t 1 - guide_S) with the larger root t of v_S' G_SS v_S = radius^2.
    None when G_SS is singular or the result fails the optimality conditions (then the solver's w* is used)."""
    keep = w > 1e-6
    g, a = gram[np.ix_(keep, keep)], guide[keep]
    if np.linalg.cond(g) > 1e10:
        return None
    ones = np.ones(len(a))
    h1, ha = np.linalg.solve(g, ones), np.linalg.solve(g, a)
    qa, qb, qc = ones @ h1, ones @ ha, a @ ha - radius * radius  # qa t^2 - 2 qb t + qc = 0
    disc = qb * qb - qa * qc
    if qa <= 0 or disc < 0:
        return None
    t = (qb + math.sqrt(disc)) / qa
    v = np.zeros(len(w))
    v[keep] = t * h1 - ha
    scale = float(np.max(np.abs(guide))) + radius * math.sqrt(float(np.max(np.diag(gram))))
    if v.min() < -1e-9 * max(float(np.abs(v).max()), 1e-300) or (guide + gram @ v).min() < t - 1e-9 * scale:
        return None  # a client of S would need a negative weight, or one outside S would fare worse than t
    return np.clip(v, 0.0, None)


def combination(gram: np.ndarray, weights: list[float], c: float, rescale: bool = False,
                solver: str = "CLARABEL") -> tuple[list[float], int]:
    """d* = sum_j gamma_j Delta_j / W as (gamma, conflicting pairs), W = sum of `weights` (the 1/N of Eq. 3 is
    weights = 1). Stage 1: gamma = weights less the projections of Eq. 3; Stage 2 adds W c ||Delta_perp|| w* /
    ||Delta_w*|| (made exact by `polish`). Without a conflict, c = 0 and no rescaling, gamma is `weights` exactly."""
    n, total = len(weights), sum(weights)
    gamma = np.array(weights, dtype=np.float64)
    conflicts = 0
    for i in range(n):
        for j in range(n):
            if i != j and gram[i, j] < 0:  # Delta_i loses its component along the original Delta_j
                gamma[j] -= weights[i] * gram[i, j] / gram[j, j]
                conflicts += i < j
    perp2 = float(gamma @ gram @ gamma) / total ** 2  # ||Delta_perp||^2
    if c > 0 and perp2 > 0:
        radius = c * math.sqrt(perp2)
        guide = gram @ gamma / total  # Delta_j . Delta_perp
        w = worst_client_weights(gram, guide, math.sqrt(perp2), c, solver)
        norm_w = math.sqrt(max(float(w @ gram @ w), 0.0))
        if norm_w > DEGENERATE * math.sqrt(float(np.max(np.diag(gram)))):
            v = polish(gram, guide, radius, w)  # d* - Delta_perp = sum_j v_j Delta_j
            gamma = gamma + total * (radius * w / norm_w if v is None else v)
    if rescale:
        gamma = gamma / (1.0 + c * c)
    return [float(g) for g in gamma], conflicts


def aggregate(theta: dict[str, Tensor], clients: list[dict[str, Tensor]], weights: list[float], c: float,
              rescale: bool = False, scope: str = "model", solver: str = "CLARABEL"
              ) -> tuple[dict[str, Tensor], dict[str, float]]:
    """theta + d* for each tensor of `theta` (the round's global parameters), the clients' trained parameters
    `clients` in client order, with their raw weights; plus diagnostics: the fraction of client pairs in conflict
    (averaged over the tensors under scope=layer), ||d*|| and the worst cosine between d* and a Delta_j."""
    keys = list(theta)
    groups = [keys] if scope == "model" else [[k] for k in keys]
    n, total = len(clients), sum(weights)
    new: dict[str, Tensor] = {}
    dots, norm2, sq = np.zeros(n), 0.0, np.zeros(n)  # d* . Delta_j, ||d*||^2, ||Delta_j||^2 over all tensors
    conflict_share = []
    for group in groups:
        gram = np.zeros((n, n))
        for k in group:
            x = theta[k].double()
            deltas = torch.stack([cl[k].to(x.device, torch.float64) - x for cl in clients]).flatten(1)
            gram += (deltas @ deltas.T).cpu().numpy()
        gram = (gram + gram.T) / 2  # exactly symmetric: a pair conflicts both ways or not at all
        gamma, conflicts = combination(gram, weights, c, rescale, solver)
        keep = 1.0 - sum(gamma) / total  # the weight left on theta_g
        for k in group:
            x = theta[k]
            acc = torch.zeros_like(x, dtype=torch.float64)
            for g, cl in zip(gamma, clients):  # as the orchestrator sums its mean: float64, client order
                acc.add_(cl[k].to(x.device, torch.float64), alpha=g)
            new[k] = (acc / total + keep * x.double()).to(x.dtype)
        coef = np.array(gamma) / total
        dots += gram @ coef
        norm2 += float(coef @ gram @ coef)
        sq += np.diag(gram)
        conflict_share.append(conflicts / (n * (n - 1) / 2) if n > 1 else 0.0)
    cosines = [dots[j] / math.sqrt(norm2 * sq[j]) for j in range(n) if norm2 > 0 and sq[j] > 0]
    stats = {"server/conflicts": float(np.mean(conflict_share)) if conflict_share else 0.0,
             "server/update_norm": math.sqrt(max(norm2, 0.0)),
             "server/worst_cos": float(min(cosines)) if cosines else 0.0}
    return new, stats


class ConFREEServer(Server):
    metric_directions = {"server/conflicts": NEITHER, "server/update_norm": NEITHER, "server/worst_cos": NEITHER}
    needs_every_upload = True  # Algorithm 1, lines 8-14 use every client's update

    def setup(self, module: ClientModule, data) -> None:
        super().setup(module, data)
        self.keys = [k for k in update_keys(module) if k in self.global_params]
        self._round: dict[str, float] = {}

    def weight(self, cid: int, upload: Upload) -> float:  # Eq. 3's weights, and the buffers' mean's
        return 1.0 if self.hp.weighting == "uniform" else upload.weight

    def aggregate(self, uploads: Uploads) -> dict[str, Tensor]:
        clients = uploads.clients
        if not clients:
            return {}
        theta = {k: self.global_params[k] for k in self.keys}
        params, self._round = aggregate(theta, [{k: u.params[k] for k in self.keys} for u in clients],
                                        [u.weight for u in clients], float(self.hp.c), bool(self.hp.rescale),
                                        self.hp.scope, self.hp.solver)
        mean = uploads.mean()  # for the buffers
        return {k: params[k] if k in params else mean[k] for k in self.global_params if k in params or k in mean}

    def on_round_end(self, ctx, metrics: dict[str, Any]) -> None:
        metrics.update(self._round)
        self._round = {}


register_method("confree", ConFREEConfig, FedRepClient, ConFREEServer, resolve=fedrep_resolve)
