"""FedProx (Li et al., 2020): FedAvg with a proximal term (mu/2)||w - w_global||^2 in the client loss."""
from dataclasses import dataclass

import torch

from fl.config import MethodConfig, param
from fl.core import ClientModule, Server, register_method
from fl.core.client import cross_entropy
from fl.core.metric_directions import LOWER


@dataclass
class FedProxConfig(MethodConfig):
    name: str = "fedprox"
    mu: float = param(0.01, ge=0.0, search={"distribution": "log_uniform_values", "min": 1e-4, "max": 1.0},
                      help="proximal weight mu")


class FedProxClient(ClientModule):
    metric_directions = {"ce": LOWER, "prox": LOWER}
    functional = True  # trainer.parallel_clients differentiates the same client_loss, vmapped over clients

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        self.mu = float(self.hp.mu)  # a plain float: the compiled vmapped step reads it (a config read breaks graphs)

    def on_local_train_start(self) -> None:
        # the global model received this round; the anchor of the proximal term
        self.anchor = {k: p.detach().clone() for k, p in self.named_parameters()}

    def training_step(self, batch, batch_idx):  # the client loss: Eq. (2) on this client's parameters and anchor
        return self.client_loss(self, self.parameters_by_name(), self.loss_inputs(), batch)

    def loss_inputs(self):
        return {"anchor": self.anchor}

    def client_loss(self, forward, params, inputs, batch, mask=None):
        """h_k(w; w^t) = F_k(w) + (mu/2) ||w - w^t||^2, the local objective of Li et al. (2020), Eq. (2): F_k the
        cross-entropy on the batch, w^t the anchor. One definition for training_step and the vmapped step."""
        x, y = batch
        ce = cross_entropy(forward(x), y, mask)
        if self.mu == 0:  # plain FedAvg step; skips a pass over the parameters
            return ce
        prox = sum(torch.sum((params[k] - a) ** 2) for k, a in inputs["anchor"].items())
        return {"loss": ce + 0.5 * self.mu * prox, "ce": ce.detach(), "prox": prox.detach()}


register_method("fedprox", FedProxConfig, FedProxClient, Server)
