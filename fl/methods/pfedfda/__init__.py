"""pFedFDA (McLaughlin & Su, NeurIPS 2024): personalized FL via feature distribution adaptation.

A shared backbone phi and a generative head: class-conditional Gaussians N(mu_c, Sigma) with one tied
covariance, turned into a linear (LDA) layer by Bayes' rule (stats.py). Each round a
client trains phi through a frozen head built from the global statistics (mu_g, Sigma_g) and its local
priors, estimates local statistics from the features it saw while training, picks beta_i by k-fold
cross-validation and uploads phi_i with the interpolated statistics beta_i local + (1 - beta_i) global. The
server averages all three weighted by n_i. At evaluation each client re-estimates its statistics with the
global backbone, re-solves beta_i and classifies with its own LDA head (no gradient step), so clients that
never trained are personalised the same way.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from fl.config import MethodConfig, param
from fl.core import HEAD, ClientModule, Server, Upload, float32_island, generator, register_method
from fl.core.metric_directions import LOWER, NEITHER
from fl.methods.pfedfda.stats import estimate, interpolate, lda_head, priors, solve_beta


@dataclass
class PFedFDAConfig(MethodConfig):
    name: str = "pfedfda"
    beta_mode: str = param("single", choices=["single", "separate", "local_only"],
                           search={"values": ["single", "separate", "local_only"]},
                           help="single: one beta_i for means and covariance (SB, the paper's main results); "
                           "separate: beta for means and for covariance (MB); local_only: beta_i = 1 (NB)")
    cv_folds: int = param(2, ge=2, help="k of the k-fold cross-validation that picks beta_i")
    beta_solver: str = param("bounded", choices=["bounded", "lbfgs"],
                             help="bounded: the minimiser of the CV objective over [0, 1] by grid and golden-section "
                             "search (never fails); lbfgs: the official code's L-BFGS with beta clipped, falling "
                             "back to the bounded search where it fails (counted in train/beta_fallbacks)")
    beta_init: float = param(0.5, ge=0.0, le=1.0, help="L-BFGS starting point and a new client's beta")
    beta_max_iter: int = param(10, ge=1, help="L-BFGS iterations of the beta search (beta_solver=lbfgs)")
    beta_gtol: float = param(1e-3, gt=0.0, help="L-BFGS gradient tolerance (beta_solver=lbfgs)")
    cov_reg: str = param("code", choices=["code", "paper"],
                         help="covariance regularisation: code = +1e-4 on every entry and +I (official code); "
                         "paper = +1e-4 I; both then take the nearest PD matrix with the same variances")
    cov_eps: float = param(1e-4, gt=0.0, help="epsilon of the covariance regularisation")
    shrink_eps: float = param(1e-4, ge=0.0, lt=1.0, help="solve-time shrinkage (1-e) Sigma + e tr(Sigma)/d I")
    feature_bank: str = param("all_epochs", choices=["all_epochs", "last_epoch", "fresh_pass"],
                              help="features for the local statistics: every batch of every local epoch (code), "
                              "the last epoch's, or one no-grad pass with the trained backbone")
    eval_min_count: int = param(2, ge=0, help="at evaluation, classes with at most this many samples use the "
                                "global mean")
    full_last_round: bool = param(True, help="every client takes part in the last round")


# How each covariance regularisation can collapse the heads, for the warning: the setting that is in use is named.
COLLAPSE_CAUSES = {
    "code": "its added identity can dwarf features of a small scale",
    "paper": "its cov_eps*I leaves the covariance of a few samples near-singular, so the heads' weights Sigma^-1 mu "
             "can grow by orders of magnitude",
}


@float32_island
def lda_logits(z: Tensor, W: Tensor, b: Tensor) -> Tensor:
    """The LDA head z W^T + b in float32 under mixed precision: b = -1/2 mu Sigma^-1 mu + log pi cancels most of
    z W^T, so half-precision logits flip predictions (bf16: 3.6% of the global head's), and W = Sigma^-1 mu can
    exceed float16's range."""
    return F.linear(z, W, b)


def _log_prior(module: PFedFDAClient, cid: int) -> Tensor:
    if cid < 0:  # the global model: uniform priors
        return torch.full((module.num_classes,), -np.log(module.num_classes), dtype=torch.float64)
    return priors(module.train_split(module.data, cid).y, module.num_classes).log()


class PFedFDAClient(ClientModule):
    needs_backbone = True  # the body and the head are trained apart
    persistent = ("beta",)  # (beta_mu, beta_cov) of the client's last beta search
    reuse_personalized = True  # the evaluation head is written into the head's parameters (set_head)

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        self.model.head.requires_grad_(False)  # the head is LDA(mu, Sigma, pi), never a trained layer
        self.glob: Optional[tuple[Tensor, Tensor]] = None
        self.beta = (float(self.hp.beta_init),) * 2
        self.bank: list[tuple[Tensor, Tensor]] = []
        self.last_pass: list[tuple[Tensor, Tensor]] = []
        self.result: dict[str, Any] = {}

    @property
    def dev(self) -> torch.device:
        """Where the parameters live."""
        return self.model.head.weight.device

    def is_private(self, key: str) -> bool:
        return key.startswith(HEAD)  # rebuilt from statistics before every use; never averaged

    def forward(self, x: Tensor) -> Tensor:
        return self.head_logits(self.model.backbone(x))

    def head_logits(self, z: Tensor) -> Tensor:
        head = self.model.head
        return lda_logits(z, head.weight, head.bias)

    @float32_island
    def predict(self, x: Tensor) -> Tensor:
        """The client's LDA head on float32 features: its statistics come from float32 features (`features`), so
        the features it classifies are computed the same way."""
        return self(x)

    # ---- communication and state ----------------------------------------------------------------
    def receive(self, payload: dict[str, Any]) -> None:
        super().receive(payload)
        self.glob = (payload["mu"].to(self.dev, torch.float64), payload["cov"].to(self.dev, torch.float64))

    def load_client_state(self, state: Optional[dict[str, Any]]) -> None:
        super().load_client_state(state)
        # a usable head at once: global statistics with this client's priors (uniform for the global model, cid -1)
        self.set_head(*self.glob, _log_prior(self, self.cid))

    def upload(self) -> Upload:
        shared = {k: v.detach() for k, v in self.shared_state().items()}
        return Upload(params=shared, weight=float(self.num_train), message=self.result)

    @torch.no_grad()
    def set_head(self, mu: Tensor, cov: Tensor, log_prior: Tensor) -> None:
        W, b = lda_head(mu, cov, log_prior.to(mu.device), self.hp.shrink_eps)
        head = self.model.head
        head.weight.copy_(W.to(head.weight.dtype))
        head.bias.copy_(b.to(head.bias.dtype))

    # ---- local training: the backbone learns through a frozen head of global statistics ------------
    def on_local_train_start(self) -> None:
        self.log_prior = _log_prior(self, self.cid).to(self.dev)
        self.set_head(*self.glob, self.log_prior)  # fixed for the round (Sec. 4.2; Algorithm 1, line 7)
        self.bank, self.last_pass = [], []

    def training_step(self, batch, batch_idx):
        x, y = batch
        z = self.model.backbone(x)
        loss = F.cross_entropy(self.head_logits(z), y)
        if self.hp.feature_bank != "fresh_pass":  # the features the loss saw (autocast's, under mixed precision)
            self.bank.append((z.detach(), y))
        return loss

    def on_local_epoch_end(self, epoch: int) -> None:
        if self.hp.feature_bank == "last_epoch":  # keep only the latest complete pass
            self.last_pass, self.bank = self.bank, []

    def on_local_train_end(self) -> None:
        z, y = self._bank_or_pass()
        r = self.solve_beta(z, y, self.log_prior, "pfedfda/cv")
        self.beta = (r.beta_mu, r.beta_cov)
        local = estimate(z, y, self.glob[0], self.hp.cov_reg, eps=self.hp.cov_eps)
        mu, cov = interpolate(r.beta_mu, r.beta_cov, local, self.glob)
        self.result = {"mu": mu, "cov": cov, "n": float(self.num_train), "beta": r.beta_mu, "beta_cov": r.beta_cov,
                       "fallback": float(r.fallback)}
        self.bank, self.last_pass = [], []

    def _bank_or_pass(self) -> tuple[Tensor, Tensor]:
        bank = self.bank or self.last_pass  # last_epoch: a partial pass (local_steps) counts if there is one
        if self.hp.feature_bank == "fresh_pass" or not bank:
            return self.features(self.cid)
        return torch.cat([b[0] for b in bank]).to(torch.float64), torch.cat([b[1] for b in bank])

    def solve_beta(self, z: Tensor, y: Tensor, log_prior: Tensor, purpose: str):
        """beta_i by k-fold cross-validation on the features (z, y) (Eq. 9), seeded per (round, client, purpose)."""
        hp = self.hp
        return solve_beta(z, y, self.glob, log_prior, mode=hp.beta_mode, k=hp.cv_folds, cov_reg=hp.cov_reg,
                          shrink_eps=hp.shrink_eps, max_iter=hp.beta_max_iter, gtol=hp.beta_gtol,
                          gen=generator(self.cfg.seed, self.round, self.cid, purpose), prev=self.beta,
                          init=hp.beta_init, solver=hp.beta_solver, cov_eps=hp.cov_eps)

    def features(self, cid: int) -> tuple[Tensor, Tensor]:
        """One no-grad pass of the current backbone over the client's training split (float64, no autocast)."""
        zs, ys = zip(*self.eval_pass(self.train_split(self.data, cid), self.model.backbone, autocast=False))
        return torch.cat([z.to(torch.float64) for z in zs]), torch.cat(ys)

    # ---- evaluation: Alg. 1 lines 8-11 with the global backbone, no gradient step ----------------------
    def personalize(self) -> dict[str, float]:
        cid = self.cid
        z, y = self.features(cid)
        log_prior = _log_prior(self, cid).to(self.dev)
        r = self.solve_beta(z, y, log_prior, "pfedfda/cv_eval")
        local = estimate(z, y, self.glob[0], self.hp.cov_reg, min_count=self.hp.eval_min_count, eps=self.hp.cov_eps)
        self.set_head(*interpolate(r.beta_mu, r.beta_cov, local, self.glob), log_prior)
        logs = {"beta_eval": r.beta_mu}  # the beta this client's evaluated head used
        if self.hp.beta_mode == "separate":
            logs["beta_cov_eval"] = r.beta_cov
        # a head that puts every one of the client's (multi-class) training samples in one class has collapsed
        # (COLLAPSE_CAUSES: either regularisation can do it)
        with torch.no_grad():
            preds = self.head_logits(z.to(self.model.head.weight.dtype)).argmax(1)
        logs["head_collapsed"] = float(len(torch.unique(y)) > 1 and len(torch.unique(preds)) == 1)
        return logs


class PFedFDAServer(Server):
    # beta: how much each head leans on the global statistics, a diagnostic; a collapsed head is a fault
    metric_directions = {"train/beta_mean": NEITHER, "train/beta_fallbacks": NEITHER, "test/beta_mean": NEITHER,
                         "test/collapsed_heads": LOWER}

    def setup(self, module: PFedFDAClient, data) -> None:
        super().setup(module, data)
        C, d, device = data.num_classes, module.model.feature_dim, module.dev
        # Algorithm 1, line 2 ("random spherical Gaussians"), as the official code draws them:
        # mu_g ~ U[0, 1)^{C x d}, Sigma_g = I
        gen = generator(self.cfg.seed, 0, -1, "pfedfda/init_means")
        self.mu = torch.rand(C, d, generator=gen, dtype=torch.float64).to(device)
        self.cov = torch.eye(d, dtype=torch.float64, device=device)

    def select(self, round_idx: int, sampled: list[int]) -> list[int]:
        if self.hp.full_last_round and round_idx == self.cfg.trainer.rounds - 1:
            return list(range(self.data.num_train_clients))
        return sampled

    def broadcast(self, cid: int) -> dict[str, Any]:
        return {"params": self.global_params, "mu": self.mu, "cov": self.cov}

    def server_step(self, ctx, mean: dict[str, Tensor], messages: dict[int, dict]) -> None:
        super().server_step(ctx, mean, messages)
        if not messages:
            return
        # sample-weighted mean of the interpolated statistics, summed in client order (1 and 2 processes agree)
        total = sum(m["n"] for m in messages.values())
        mu = sum(m["n"] / total * m["mu"].to(self.mu.device) for m in messages.values())
        cov = sum(m["n"] / total * m["cov"].to(self.cov.device) for m in messages.values())
        self.mu, self.cov = mu, (cov + cov.T) / 2
        self.round_betas = {cid: (m["beta"], m["beta_cov"], m["fallback"]) for cid, m in messages.items()}

    def on_round_end(self, ctx, metrics: dict) -> None:
        betas = getattr(self, "round_betas", {})
        for cid, (b, bc, _) in betas.items():
            metrics[f"client/{cid}/beta"] = b
            if self.hp.beta_mode == "separate":
                metrics[f"client/{cid}/beta_cov"] = bc
        if betas:
            metrics["train/beta_mean"] = float(np.mean([b for b, _, _ in betas.values()]))
            metrics["train/beta_fallbacks"] = float(sum(fb for _, _, fb in betas.values()))
        self.round_betas = {}

    def on_evaluate(self, ctx, metrics: dict) -> None:
        # client/<i>/beta_eval: the beta each client's evaluated head used (personalize)
        betas = torch.tensor([metrics[f"client/{cid}/beta_eval"] for cid in range(self.data.num_clients)],
                             dtype=torch.float64)
        metrics["test/beta_mean"] = float(betas.mean())
        ctx.log_histogram("server/beta_hist", betas.tolist())
        collapsed = sum(metrics[f"client/{cid}/head_collapsed"] for cid in range(self.data.num_clients))
        metrics["test/collapsed_heads"] = collapsed
        if collapsed and ctx.fabric.is_global_zero:
            warnings.warn(f"pFedFDA, round {ctx.round + 1}: {int(collapsed)} of {self.data.num_clients} personal heads "
                          f"predict one class for all of their client's training samples (method.cov_reg="
                          f"{self.hp.cov_reg}: {COLLAPSE_CAUSES[self.hp.cov_reg]})", stacklevel=1)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "mu": self.mu.cpu(), "cov": self.cov.cpu()}

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        super().load_state_dict(state, device)
        self.mu, self.cov = state["mu"].to(device), state["cov"].to(device)


register_method("pfedfda", PFedFDAConfig, PFedFDAClient, PFedFDAServer, headline="test/acc_weighted")
