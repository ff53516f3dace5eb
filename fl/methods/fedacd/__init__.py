"""FedACD (Zhou et al. 2025, "Enhancing the Performance of Global Model by Improving the Adaptability of
Local Models in Federated Learning"): local models whose per-class errors are pushed to be equal, so
they do well on every client's label distribution, and aggregation weighted by how well they do it.

Client m keeps P^m, the mean predicted probabilities per true class over its local data, and
minimises  L = L1 + lam * L2  (Eq. 9):
    L1 = KL(p || q), q = p with the off-target mass spread evenly (Eq. 7): flat misclassification rows
    L2 = CE(f(x) + A[y], y), A = log P - log P^T detached (Eq. 8): pushes P towards symmetry;
         columns of classes the client lacks get log(missing_delta)
on input mixup x~ = mu x_a + (1 - mu) x_b, mu ~ Beta(alpha, alpha), the loss mu-weighted over y_a and y_b
and P accumulated the same way (Input Mixup: Sec. 3 after Eq. 9, and Table 5; the paper gives neither alpha
nor how mixed labels enter the losses and P, so these are our choices; `method.p_source=clean` estimates P from
the unmixed batch instead). It uploads its weights and
V = sigmoid(1 / KL(P || Q)) (Eq. 10, Q = tau on the diagonal); the server averages with weights
V_m / sum_k V_k over the round's clients (Eq. 11). `method.aggregation=uniform` (or
`method.name=fedacd_base`) is FedACD_base.

When P is estimated (the paper does not say), `method.p_update`:
    prev_epoch  P is fixed during a local epoch; the epoch's (mixup-weighted) training outputs give the
                next epoch's P; before the first epoch P comes from `method.p_init`
    running     P is the running mean over every training output of the round so far (the initial P
                counts as one pass over the data), updated with each batch before its loss
    batch       the current batch's outputs (classes absent from the batch keep their previous row)
`method.p_init`: global_pass = a clean pass of the received global model over the local data (default);
stored = the client's P from its last round, kept in the state store (a clean pass on the first visit).
V uses a clean eval-mode pass of the final local model (`method.p_for_score=clean_pass`) or the P the
training accumulated (`train`). The P behind V is what the client keeps (`kept_P`, a persistent attribute).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from fl.config import MethodConfig, param
from fl.core import ClientModule, Server, Upload, register_method
from fl.core.metric_directions import LOWER, NEITHER
from fl.methods.fedacd.losses import accumulate, adjustment_matrix, l1_flatten, l2_adjusted_ce, rows_from, score_v
from fl.methods.mixup import InputMixup
from fl.metrics.adaptability import KL_REDUCTIONS, kl_pq, local_probability_matrix


@dataclass
class FedACDConfig(MethodConfig):
    name: str = "fedacd"
    lam: float = param(1.0, ge=0.0, search={"values": [0.5, 1.0, 1.5, 2.0]}, help="lambda: weight of L2 (Eq. 9)")
    tau: float = param(1.0 - 1e-5, gt=0.0, lt=1.0, search={"values": [0.9, 0.99, 0.999, 0.99999]},
                       help="diagonal of the template Q in V = sigmoid(1 / KL(P||Q)) (Eq. 10)")
    missing_delta: float = param(1e-3, gt=0.0, le=1.0, search={"values": [1e-1, 1e-2, 1e-3, 1e-4]},
                                 help="Delta_yk of a class k the client lacks (the paper's 'small value')")
    mixup: bool = param(True, help="input mixup (false = the paper's 'w/o mixup' ablation)")
    alpha: float = param(1.0, gt=0.0, help="mixup: mu ~ Beta(alpha, alpha), one mu per batch")
    p_update: str = param("prev_epoch", choices=["prev_epoch", "running", "batch"],
                          help="when the P behind L2 is refreshed (see the module docstring)")
    p_source: str = param("mixed", choices=["mixed", "clean"],
                          help="what P behind L2 averages: the training outputs on the mixed inputs, mu-weighted "
                          "over y_a and y_b (our reading), or a no-grad pass over the same batch unmixed")
    p_init: str = param("global_pass", choices=["global_pass", "stored"],
                        help="P before the first epoch: a clean pass of the received global model, or the "
                        "client's P from its last round (state store)")
    p_for_score: str = param("clean_pass", choices=["clean_pass", "train"],
                             help="P behind V: a clean pass of the final local model, or the training estimate")
    p_eps: float = param(1e-8, gt=0.0, help="P is clamped to at least this before its log")
    kl_reduction: str = param("mean_present", choices=list(KL_REDUCTIONS),
                              help="KL(P||Q): mean over the rows of present classes (Table 9's scale), "
                              "sum (Eq. 10 literally) or sum / C")
    aggregation: str = param("v", choices=["v", "uniform"],
                             help="v: weights V_m / sum V_k (FedACD); uniform: FedACD_base")


@dataclass
class FedACDBaseConfig(FedACDConfig):
    """FedACD_base, FedACD's ablation (Zhou et al. 2025): the same client losses, uniform aggregation weights."""

    name: str = "fedacd_base"
    aggregation: str = param("uniform", choices=["uniform"], help="FedACD_base: uniform weights")


class FedACDClient(ClientModule):
    metric_directions = {"l1": LOWER, "l2": LOWER}
    persistent = ("kept_P",)  # the P behind the client's last V (None before its first round)

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        self.kept_P: Optional[Tensor] = None
        self.V, self.kl = 1.0, 0.0

    @property
    def model_device(self) -> torch.device:
        return next(self.parameters()).device

    # ---- communication ----------------------------------------------------------------------------
    def upload(self) -> Upload:
        up = super().upload()
        up.message = {"V": self.V, "kl_PQ": self.kl}
        return up

    # ---- local training -------------------------------------------------------------------------
    def _clean_P(self) -> Tensor:
        sums, n = local_probability_matrix(self, self.train_split(self.data, self.cid))
        return rows_from(sums, n, torch.zeros_like(sums))

    def on_local_train_start(self) -> None:
        hp, C = self.hp, self.num_classes
        train = self.train_split(self.data, self.cid)
        self.counts = torch.bincount(train.y, minlength=C).to(self.model_device, torch.float64)
        self.present = self.counts > 0  # from the labels, not the accumulator (empty early on)
        if hp.p_init == "stored" and self.kept_P is not None:
            self.P = self.kept_P.to(self.model_device, torch.float64)
        else:
            self.P = self._clean_P()
        # running: the initial P counts as one pass over the data
        self._sums = self.P * self.counts[:, None] if hp.p_update == "running" else torch.zeros_like(self.P)
        self._weights = self.counts.clone() if hp.p_update == "running" else torch.zeros_like(self.counts)
        self.A = adjustment_matrix(self.P, self.present, hp.missing_delta, hp.p_eps)
        self._mixup = InputMixup(hp.alpha, int(self.cfg.seed), self.round, self.cid, "fedacd/mixup")

    def _mix(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, float]:
        return self._mixup(x, y) if self.hp.mixup else (x, y, 1.0)

    def training_step(self, batch, batch_idx):
        hp = self.hp
        x, y_a = batch
        clean = self._clean_probs(x) if hp.p_source == "clean" and hp.mixup else None  # before BN stats move
        x, y_b, mu = self._mix(x, y_a)
        logits = self(x).float()  # the losses in fp32 under mixed precision
        logp = F.log_softmax(logits, dim=1)
        if hp.p_update == "batch":
            self._sums.zero_(), self._weights.zero_()
        if clean is not None:
            accumulate(self._sums, self._weights, clean, y_a, 1.0)
        else:
            probs = logp.detach().exp()
            accumulate(self._sums, self._weights, probs, y_a, mu)
            if mu < 1.0:
                accumulate(self._sums, self._weights, probs, y_b, 1.0 - mu)
        if hp.p_update != "prev_epoch":  # this batch counts before its loss
            self.P = rows_from(self._sums, self._weights, self.P)
            self.A = adjustment_matrix(self.P, self.present, hp.missing_delta, hp.p_eps)
        l1 = l1_flatten(logp, y_a).mean()
        l2 = l2_adjusted_ce(logits, y_a, self.A).mean()
        if mu < 1.0:
            l1 = mu * l1 + (1.0 - mu) * l1_flatten(logp, y_b).mean()
            l2 = mu * l2 + (1.0 - mu) * l2_adjusted_ce(logits, y_b, self.A).mean()
        return {"loss": l1 + hp.lam * l2, "l1": l1.detach(), "l2": l2.detach()}

    def _clean_probs(self, x: Tensor) -> Tensor:
        """Softmax outputs on the unmixed batch, in eval mode (norm statistics untouched), without gradients."""
        self.eval()
        with torch.no_grad():
            probs = F.softmax(self(x).float(), dim=1)
        self.train()
        return probs

    def on_local_epoch_end(self, epoch: int) -> None:
        if self.hp.p_update == "prev_epoch":  # this epoch's outputs are the next epoch's P
            self.P = rows_from(self._sums, self._weights, self.P)
            self.A = adjustment_matrix(self.P, self.present, self.hp.missing_delta, self.hp.p_eps)
            self._sums.zero_(), self._weights.zero_()

    def on_local_train_end(self) -> None:
        hp = self.hp
        P = self._clean_P() if hp.p_for_score == "clean_pass" else self.P
        self.kl = float(kl_pq(P, self.present, hp.tau, hp.kl_reduction, hp.p_eps))
        self.V = score_v(self.kl)
        self.kept_P = P.detach()


class FedACDServer(Server):
    """w = sum_m V_m / sum_k V_k w_m over the round's clients (the orchestrator normalises the weights)."""
    metric_directions = {"server/V_mean": NEITHER, "server/V_min": NEITHER, "server/V_max": NEITHER,
                         "server/kl_PQ_mean": LOWER}  # V: the clients' scores; KL as test/kl_PQ

    def __init__(self, cfg):
        super().__init__(cfg)
        self._scores: dict[int, dict] = {}

    def weight(self, cid: int, upload: Upload) -> float:
        return float(upload.message["V"]) if self.hp.aggregation == "v" else 1.0

    @classmethod
    def own_aggregation(cls, hp) -> Optional[str]:
        return "its aggregation weights are the clients' scores V (Eq. 11, method.aggregation=v)" if (
            hp.aggregation == "v") else None

    def server_step(self, ctx, mean: dict[str, Tensor], messages: dict[int, dict]) -> None:
        super().server_step(ctx, mean, messages)
        self._scores = {cid: msg for cid, msg in messages.items() if msg}

    def on_round_end(self, ctx, metrics: dict) -> None:
        if not self._scores:
            return
        V = [float(m["V"]) for m in self._scores.values()]
        kl = [float(m["kl_PQ"]) for m in self._scores.values()]
        for cid, m in self._scores.items():
            metrics[f"client/{cid}/V"] = float(m["V"])
            metrics[f"client/{cid}/kl_PQ"] = float(m["kl_PQ"])
        metrics.update({"server/V_mean": sum(V) / len(V), "server/V_min": min(V), "server/V_max": max(V),
                        "server/kl_PQ_mean": sum(kl) / len(kl)})
        self._scores = {}


register_method("fedacd", FedACDConfig, FedACDClient, FedACDServer, headline="test/acc_global_balanced")
register_method("fedacd_base", FedACDBaseConfig, FedACDClient, FedACDServer, headline="test/acc_global_balanced")
