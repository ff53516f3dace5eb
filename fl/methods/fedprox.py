"""FedProx (Li et al., 2020): FedAvg with a proximal term (mu/2)||w - w_global||^2 in the client loss."""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fl.config import MethodConfig, param
from fl.core import ClientModule, Server, register_method
from fl.core.client import masked_mean


@dataclass
class FedProxConfig(MethodConfig):
    name: str = "fedprox"
    mu: float = param(0.01, ge=0.0, search={"distribution": "log_uniform_values", "min": 1e-4, "max": 1.0},
                      help="proximal weight mu")


class FedProxClient(ClientModule):
    functional = True

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        self.mu = float(self.hp.mu)  # a plain float: the compiled vmapped step reads it (a config read breaks graphs)

    def on_local_train_start(self) -> None:
        # the global model received this round; the anchor of the proximal term
        self.anchor = [p.detach().clone() for p in self.parameters()]

    def training_step(self, batch, batch_idx):
        x, y = batch
        ce = F.cross_entropy(self(x), y)
        if self.mu == 0:  # plain FedAvg step; skips a pass over the parameters
            return ce
        prox = sum(torch.sum((p - a) ** 2) for p, a in zip(self.parameters(), self.anchor))
        return {"loss": ce + 0.5 * self.mu * prox, "ce": ce.detach(), "prox": prox.detach()}

    def functional_inputs(self):
        return {"anchor": {k: a for (k, _), a in zip(self.named_parameters(), self.anchor)}}

    def functional_step(self, forward, params, inputs, x, y, mask):
        ce = masked_mean(F.cross_entropy(forward(x), y, reduction="none"), mask)
        if self.mu == 0:
            return {"loss": ce}
        prox = sum(torch.sum((params[k] - a) ** 2) for k, a in inputs["anchor"].items())
        return {"loss": ce + 0.5 * self.mu * prox, "ce": ce.detach(), "prox": prox.detach()}


register_method("fedprox", FedProxConfig, FedProxClient, Server)
