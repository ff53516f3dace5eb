"""FedBABU (Oh, Kim & Yun, ICLR 2022): federated training updates and aggregates only the body; the head
stays at its random initialisation, and each client fine-tunes before evaluation.

    federated training:  every client starts from the global body and the fixed initial head, trains the
                         body only (the head gets no update), and uploads the body; the server averages
                         the bodies (weights n_i, as FedAvg)
    evaluation:          client i fine-tunes for tau epochs (`method.finetune_epochs`) on its own data and is
                         evaluated with the fine-tuned model; the paper fine-tunes the whole model
                         (`method.finetune_part=full`), pFedFDA and FedDRM's code the head only (`head`)

The head is part of the broadcast (never of the upload), so the fine-tuned copy of a client is dropped when the
next client is loaded. `test/acc_global_micro` is the global body with the initial head, before any fine-tuning.
Fine-tuning uses the training optimizer (`optim.*`) at this round's learning rate, with its own seeded batch
order (purpose "finetune").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fl.config import MethodConfig, param
from fl.core import HEAD, ClientModule, Server, Upload, build_optimizer, register_method


@dataclass
class FedBABUConfig(MethodConfig):
    name: str = "fedbabu"
    finetune_epochs: int = param(5, ge=0, search={"values": [1, 2, 5, 10]},
                                 help="tau: local fine-tuning epochs before each client's evaluation")
    finetune_part: str = param("full", choices=["full", "head", "body"],
                               help="what fine-tuning updates: full = body and head (the paper), head = the "
                               "head only (pFedFDA, FedDRM code)")


class FedBABUClient(ClientModule):
    needs_backbone = True  # the body and the head are trained apart
    reuse_personalized = True  # fine-tuning changes the parameters only
    def _set_trainable(self, part: str) -> list:
        """Make only `part` (full / head / body) trainable; returns its parameters."""
        chosen = []
        for k, p in self.named_parameters():
            on = part == "full" or (k.startswith(HEAD) == (part == "head"))
            p.requires_grad_(on)
            if on:
                chosen.append(p)
        return chosen

    def configure_optimizers(self):
        # federated training: the body only; the head keeps its initialisation
        return build_optimizer(self.cfg, self._set_trainable("body"), self.lr)

    def upload(self) -> Upload:
        body = {k: v.detach() for k, v in self.shared_state().items() if not k.startswith(HEAD)}
        return Upload(params=body, weight=float(self.num_train))

    def personalize(self) -> None:
        if self.hp.finetune_epochs > 0:
            params = self._set_trainable(self.hp.finetune_part)
            optimizer = self.fabric.setup_optimizers(build_optimizer(self.cfg, params, self.lr))
            self.fit_local(optimizer, epochs=self.hp.finetune_epochs, purpose="finetune")
            self._set_trainable("full")


class FedBABUServer(Server):
    def server_step(self, ctx, mean: dict, messages: dict[int, Any]) -> None:
        if mean:  # the averaged body; the head stays as initialised
            self.global_params = {**self.global_params, **mean}


register_method("fedbabu", FedBABUConfig, FedBABUClient, FedBABUServer)
