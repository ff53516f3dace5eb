"""Ditto (Li, Hu, Beirami and Smith, ICML 2021): a global model and a personal model per client.

Algorithm 1 of the paper, with FedAvg as the global solver G:

    client k, given w^t:  w_k <- local SGD on F_k from w^t                      (the global objective)
                          v_k <- s steps of  v_k - eta (grad F_k(v_k) + lam (v_k - w^t))
                                 i.e. SGD on h_k(v_k; w^t) = F_k(v_k) + lam/2 ||v_k - w^t||^2
                          send w_k; keep v_k
    server:               w^{t+1} = weighted mean of the w_k                    (FedAvg)

How it maps onto this framework:
- v_k is a second copy of the network (`self.personal`), private (never uploaded), kept per client in the
  state store. Every v_k starts from w^0, the seeded initial global model, as the paper's algorithm does.
- Both models take one step on each local batch: the loss summed over the two models is separable (the
  anchor w^t is a constant), so one optimizer step over both parameter sets is exactly one SGD step on
  F_k(w) and one on h_k(v). The number of personal steps s is therefore the round's local steps
  (`trainer.local_steps`, or the batches of `trainer.local_epochs` passes), as in pFedFDA's setting
  (E personalisation epochs = E local epochs).
- Evaluation uses each client's personal model v_k; `test/acc_global_micro` scores the global model w.
- lam = 0 makes v_k plain local training (Local); lam -> infinity pins v_k to the global model.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from fl.config import MethodConfig, param
from fl.core import ClientModule, Server, register_method
from fl.core.metric_directions import LOWER


@dataclass
class DittoConfig(MethodConfig):
    name: str = "ditto"
    lam: float = param(1.0, ge=0.0, search={"values": [0.05, 0.1, 0.5, 1.0, 2.0]},
                       help="lambda: weight of the proximal term lam/2 ||v_k - w||^2 of the personal objective")


class DittoClient(ClientModule):
    metric_directions = {"ce": LOWER, "personal_ce": LOWER, "prox": LOWER}

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        self.personal = copy.deepcopy(self.model)  # v_k; starts from w^0 like the global model

    def is_private(self, key: str) -> bool:
        return key.startswith("personal.")

    def on_local_train_start(self) -> None:
        self.anchor = [p.detach().clone() for p in self.model.parameters()]  # w^t, the broadcast model

    def training_step(self, batch, batch_idx):
        x, y = batch
        ce = F.cross_entropy(self.model(x), y)  # the global model's local step (FedAvg)
        ce_personal = F.cross_entropy(self.personal(x), y)
        loss = ce + ce_personal
        logs = {"ce": ce.detach(), "personal_ce": ce_personal.detach()}
        if self.hp.lam > 0:
            prox = sum(torch.sum((v - w) ** 2) for v, w in zip(self.personal.parameters(), self.anchor))
            loss = loss + 0.5 * self.hp.lam * prox
            logs["prox"] = prox.detach()
        return {"loss": loss, **logs}

    def predict(self, x: Tensor) -> Tensor:
        return self.model(x) if self.cid < 0 else self.personal(x)


register_method("ditto", DittoConfig, DittoClient, Server)
