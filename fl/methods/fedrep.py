"""FedRep (Collins et al., "Exploiting Shared Representations for Personalized Federated Learning", 2021):
a shared representation (the backbone, averaged by the server) and a private linear head per client.

Local schedule (the paper's Algorithm 1): first the head is trained with the representation frozen, then
the representation with the (new) head frozen. Here the first `head_steps` optimizer steps of a round
train the head only and the remaining steps (trainer.local_steps or local_epochs) train the body only;
FedDRM's FedRep baseline uses 5 head steps then 5 body steps (the official FedDRM code).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fl.config import ConfigError, MethodConfig, param
from fl.core import HEAD, ClientModule, Server, register_method


@dataclass
class FedRepConfig(MethodConfig):
    name: str = "fedrep"
    head_steps: int = param(5, ge=0, search={"values": [1, 5, 10]},
                            help="head-only steps at the start of each round's local training; the rest train "
                            "the body (the representation) with the head frozen")


class FedRepClient(ClientModule):
    has_global_model = False  # the averaged representation has no head of its own
    functional = True  # trainer.parallel_clients: the same client_loss, with `trains` freezing one part per step

    def is_private(self, key: str) -> bool:
        return key.startswith(HEAD)

    def training_step(self, batch, batch_idx):
        # the client loss (cross-entropy, the base client_loss) through a model whose frozen part gets no gradient;
        # the vmapped loop differentiates the same loss and leaves the frozen part out of the step (`trains`)
        forward = self.head_only if batch_idx < self.hp.head_steps else self.representation_only
        return self.client_loss(forward, self.parameters_by_name(), self.loss_inputs(), batch)

    def head_only(self, x):  # head update: the representation gets no gradient
        with torch.no_grad():
            features = self.model.backbone(x)
        return self.model.head(features)

    def representation_only(self, x):  # representation update: the head is a constant, so it gets no gradient
        head = self.model.head
        return F.linear(self.model.backbone(x), head.weight.detach(), head.bias.detach())

    def trains(self, name: str, step: int) -> bool:  # the head first, then the representation (Algorithm 1)
        return name.startswith(HEAD) == (step < self.hp.head_steps)


def resolve(cfg) -> None:
    steps = cfg.trainer.local_steps
    if steps is not None and cfg.method.head_steps >= steps:
        raise ConfigError(f"method.head_steps={cfg.method.head_steps} must be < trainer.local_steps={steps}, "
                          "or the representation never trains")


register_method("fedrep", FedRepConfig, FedRepClient, Server, resolve)
