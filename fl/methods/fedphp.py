"""FedPHP (Li, Zhan, Shao, Li and Song, ECML PKDD 2021): federated personalization with inherited private
models (HPMs).

Each client keeps an HPM hat_w_k, a temporal ensemble of its past personalised models. In a round, client k
trains the received global model w with

    (1 - lam) CE(w; x, y) + lam * transfer(HPM -> w)

where the transfer is MMD between the two models' features (`reg=mmd`, RBF kernels, the paper's main
choice) or distillation of the HPM's softened predictions (`reg=kd`, temperature `temperature`). Then

    hat_w_k <- mu_k hat_w_k + (1 - mu_k) w_k,     mu_k = min(mu * n_k / max(floor(Q T), 1), mu)

with n_k the number of rounds client k took part in before this one (so the first visit copies w_k), Q the
participation rate and T the number of rounds: the HPM inherits more as the client ages. The server
averages the w_k (FedAvg). Evaluation scores each client's HPM; `test/acc_global_micro` scores w.

How it maps onto this framework: the HPM is `self.hpm`, private (the state store keeps it per client,
with n_k as `client_state()["visits"]`); it starts as the initial global model w^0 and acts as the
teacher in eval mode, without gradients. Integer buffers (BatchNorm counters) are copied, not averaged.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from fl.config import MethodConfig, param
from fl.core import ClientModule, Server, build_optimizer, register_method
from fl.core.metric_directions import LOWER


@dataclass
class FedPHPConfig(MethodConfig):
    name: str = "fedphp"
    mu: float = param(0.9, ge=0.0, le=1.0, search={"values": [0.5, 0.7, 0.9]},
                      help="the largest weight of the old HPM in its moving average")
    lam: float = param(0.1, ge=0.0, le=1.0, search={"values": [0.05, 0.1, 0.2]},
                       help="lambda: weight of the knowledge transfer, loss = (1 - lam) CE + lam transfer")
    reg: str = param("mmd", choices=["mmd", "kd"], help="knowledge transfer: mmd on features or kd on logits")
    temperature: float = param(4.0, gt=0.0, help="kd: temperature of the HPM's softened predictions")


def mmd_rbf(a: Tensor, b: Tensor, kernel_mul: float = 2.0, kernel_num: int = 5) -> Tensor:
    """Biased MMD^2 between samples a and b under a sum of RBF kernels whose bandwidths are spread by
    `kernel_mul` around the mean pairwise squared distance (the usual multi-kernel MMD estimate)."""
    z = torch.cat([a, b]).flatten(1)
    n = z.shape[0]
    d2 = torch.cdist(z, z).pow(2)
    base = d2.detach().sum() / (n * n - n) + 1e-8
    base = base / kernel_mul ** (kernel_num // 2)
    k = sum(torch.exp(-d2 / (base * kernel_mul ** i)) for i in range(kernel_num))
    m = a.shape[0]
    return (k[:m, :m] + k[m:, m:] - k[:m, m:] - k[m:, :m]).mean()


def hpm_weight(mu: float, visits: int, participation: float, rounds: int) -> float:
    """mu_k: the old HPM's weight at a client's (visits+1)-th participation."""
    return min(max(mu * visits / max(math.floor(participation * rounds), 1), 0.0), mu)


class FedPHPClient(ClientModule):
    metric_directions = {"ce": LOWER, "transfer": LOWER}
    persistent = ("visits",)  # n_k, the rounds the client took part in

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        self.hpm = copy.deepcopy(self.model)  # the inherited private model; starts from w^0
        self.visits = 0

    def is_private(self, key: str) -> bool:
        return key.startswith("hpm.")

    def configure_optimizers(self):
        return build_optimizer(self.cfg, self.model.parameters(), self.lr)  # the HPM is never trained

    def on_local_train_start(self) -> None:
        self.hpm.eval()  # the teacher

    def training_step(self, batch, batch_idx):
        x, y = batch
        feats = self.model.backbone(x)
        logits = self.model.head(feats)
        ce = F.cross_entropy(logits, y)
        if self.hp.lam == 0:
            return ce
        with torch.no_grad():
            t_feats = self.hpm.backbone(x)
            t_logits = self.hpm.head(t_feats)
        if self.hp.reg == "mmd":
            transfer = mmd_rbf(feats, t_feats)
        else:  # soft cross-entropy against the HPM's tempered predictions
            transfer = -(F.softmax(t_logits / self.hp.temperature, 1) * F.log_softmax(logits, 1)).sum(1).mean()
        loss = (1 - self.hp.lam) * ce + self.hp.lam * transfer
        return {"loss": loss, "ce": ce.detach(), "transfer": transfer.detach()}

    def on_local_train_end(self) -> None:
        t = self.cfg.trainer
        mu = hpm_weight(self.hp.mu, self.visits, t.participation, t.rounds)
        with torch.no_grad():
            new = self.model.state_dict()
            for k, old in self.hpm.state_dict().items():
                if old.is_floating_point():
                    old.mul_(mu).add_(new[k], alpha=1 - mu)
                else:
                    old.copy_(new[k])
        self.visits += 1

    def predict(self, x: Tensor) -> Tensor:
        return self.model(x) if self.cid < 0 else self.hpm(x)


register_method("fedphp", FedPHPConfig, FedPHPClient, Server)
