"""FedNTD (Lee et al., NeurIPS 2022, "Preservation of the Global Knowledge by Not-True Distillation in Federated
Learning"): local training distils the global model's predictions on the classes other than the true one, so
the local model keeps the global knowledge that the local labels do not speak for; aggregation is FedAvg's.

The client loss (not-true distillation):

    L = CE(q_l, y) + beta * L_NTD,
    L_NTD = sum_{c != y} q~_g^tau(c) log(q~_g^tau(c) / q~_l^tau(c))      (KL over the not-true classes)
    q~^tau(c) = exp(z_c / tau) / sum_{c' != y} exp(z_c' / tau)

z the logits of the local model (q_l) and of the global model received at the start of the round (q_g), which
stays frozen during the round. L_NTD is averaged over the batch; the true class takes no part in it, so it
neither pushes nor holds the true-class logit.

`tau_squared` (default true) multiplies L_NTD by tau^2, as the authors' released loss does (the usual distillation
scaling, which keeps the gradient's size as tau grows); false is L_NTD as written above. At tau = 1 they agree.

The frozen global model runs in eval mode (BatchNorm with the received statistics, no dropout draws); the
paper does not say. beta = 0 gives FedAvg's training exactly: the term is computed (and logged as `ntd`) but
adds nothing.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fl.config import MethodConfig, param
from fl.core import ClientModule, Server, register_method
from fl.core.metric_directions import LOWER


@dataclass
class FedNTDConfig(MethodConfig):
    name: str = "fedntd"
    beta: float = param(1.0, ge=0.0, search={"values": [0.1, 0.3, 1.0, 3.0]},
                        help="beta: weight of the not-true distillation loss")
    tau: float = param(1.0, gt=0.0, search={"values": [0.5, 1.0, 3.0]},
                       help="tau: softmax temperature of the not-true distributions")
    tau_squared: bool = param(True, help="multiply L_NTD by tau^2, as the authors' released loss does; false: "
                              "L_NTD without the factor (both agree at tau = 1)")


def not_true(logits: Tensor, y: Tensor) -> Tensor:
    """The logits of every class but the true one, [B, C-1], in class order."""
    keep = torch.ones_like(logits, dtype=torch.bool).scatter_(1, y[:, None], False)
    return logits[keep].view(len(y), -1)


def ntd_loss(local_logits: Tensor, global_logits: Tensor, y: Tensor, tau: float) -> Tensor:
    """KL(q~_g^tau || q~_l^tau) over the not-true classes, averaged over the batch."""
    log_q_l = F.log_softmax(not_true(local_logits, y) / tau, dim=1)
    log_q_g = F.log_softmax(not_true(global_logits, y).detach() / tau, dim=1)
    return (log_q_g.exp() * (log_q_g - log_q_l)).sum(dim=1).mean()


class FedNTDClient(ClientModule):
    metric_directions = {"ce": LOWER, "ntd": LOWER}

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        self._set_global(None)

    def _set_global(self, model: Optional[nn.Module]) -> None:
        # kept outside the module tree: a submodule would enter state_dict, the upload and the checkpoints
        object.__setattr__(self, "_global_model", model)

    def on_local_train_start(self) -> None:
        frozen = copy.deepcopy(self.model).eval()  # the global model, as received this round
        frozen.requires_grad_(False)
        self._set_global(frozen)

    def on_local_train_end(self) -> None:
        self._set_global(None)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        with torch.no_grad():
            global_logits = self._global_model(x)
        ce = F.cross_entropy(logits, y)
        ntd = ntd_loss(logits.float(), global_logits.float(), y, self.hp.tau)
        if self.hp.tau_squared:
            ntd = self.hp.tau ** 2 * ntd
        return {"loss": ce + self.hp.beta * ntd, "ce": ce.detach(), "ntd": ntd.detach()}


register_method("fedntd", FedNTDConfig, FedNTDClient, Server)
