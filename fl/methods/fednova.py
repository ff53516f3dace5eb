"""FedNova (Wang et al., NeurIPS 2020, "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization"): normalised averaging, so clients that take more local steps do not pull the global model
towards their own objective.

The paper's generalized update rule writes client i's round as x - y_i = eta * G_i a_i, G_i its stacked
stochastic gradients and a_i how local steps weight them; FedNova averages the normalised updates
G_i a_i / ||a_i||_1 with weights p_i and moves the global model by tau_eff = sum_i p_i ||a_i||_1 of them:

    d_i     = (x - y_i) / ||a_i||_1   (= eta G_i a_i / ||a_i||_1)
    x      <- x - tau_eff * sum_i p_i d_i,      tau_eff = sum_i p_i ||a_i||_1

||a_i||_1 for the paper's local solvers, with tau_i the optimizer steps client i took this round:
    plain SGD                 tau_i
    SGD with momentum rho     [tau_i - rho (1 - rho^tau_i) / (1 - rho)] / (1 - rho)
(momentum as torch.optim.SGD applies it, v <- rho v + g, x <- x - eta v, with v = 0 at the start of the round:
the framework builds a fresh optimizer every round). Weight decay is part of g. With equal tau_i every
||a_i||_1 is the same, tau_eff equals it and the step is x <- sum_i p_i y_i: FedAvg.

How it maps onto this framework:
- p_i = n_i / sum of the round's n_j, as FedAvg weighs here. Each client uploads d_i under its parameters'
  names, so the orchestrator's weighted mean is sum_i p_i d_i; buffers (BatchNorm statistics) are uploaded
  as they are and take FedAvg's average.
- ||a_i||_1 and n_i travel in the message; the server forms tau_eff from them.
- tau_i counts the training steps taken. Under fp16 loss scaling (`fabric.precision=16-mixed`) a step the
  scaler skips is still counted. Only SGD is accepted: a_i is not defined for Adam here.
- The paper's optional server momentum and the proximal local solver are not included.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fl.config import ConfigError, MethodConfig
from fl.core import ClientModule, Server, Upload, register_method
from fl.core.metric_directions import NEITHER


@dataclass
class FedNovaConfig(MethodConfig):
    name: str = "fednova"


def normaliser(steps: int, momentum: float) -> float:
    """||a_i||_1 for `steps` steps of SGD with `momentum` rho: sum_{k=1..steps} (1 - rho^k) / (1 - rho)."""
    if momentum == 0.0:
        return float(steps)
    rho = float(momentum)
    return (steps - rho * (1.0 - rho ** steps) / (1.0 - rho)) / (1.0 - rho)


def normalised_keys(module: ClientModule) -> list[str]:
    """Parameters whose updates are normalised: shared, trainable, floating point (buffers are averaged)."""
    return [k for k, p in module.named_parameters()
            if p.requires_grad and p.is_floating_point() and not module.is_private(k)]


class FedNovaClient(ClientModule):
    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        self._x: dict[str, Tensor] = {}
        self._steps = 0

    def on_local_train_start(self) -> None:
        keys = set(normalised_keys(self))
        self._x = {k: p.detach().clone() for k, p in self.named_parameters() if k in keys}  # x, as received
        self._steps = 0

    def training_step(self, batch, batch_idx):
        self._steps += 1  # each training step is one optimizer step (automatic optimization)
        return super().training_step(batch, batch_idx)

    def upload(self) -> Upload:
        up = super().upload()
        a = normaliser(self._steps, self.cfg.optim.momentum)
        for k, x in self._x.items():  # d_i = (x - y_i) / ||a_i||_1
            up.params[k] = (x - up.params[k]) / a if a > 0 else torch.zeros_like(x)
        up.message = {"a": a, "tau": self._steps, "n": up.weight}
        self._x = {}
        return up


class FedNovaServer(Server):
    metric_directions = {"server/tau_eff": NEITHER, "server/tau_min": NEITHER, "server/tau_max": NEITHER}

    def setup(self, module: ClientModule, data) -> None:
        super().setup(module, data)
        self.normalised = set(normalised_keys(module)) & set(self.global_params)
        self._round: dict[str, float] = {}

    def server_step(self, ctx, mean: dict[str, Tensor], messages: dict[int, dict]) -> None:
        msgs = [messages[cid] for cid in sorted(messages) if messages[cid]]
        total = sum(float(m["n"]) for m in msgs)
        if not mean or total <= 0:
            return
        # tau_eff = sum_i p_i ||a_i||_1 with the p_i of the mean (weights n_i over the round's clients)
        tau_eff = sum(float(m["n"]) * float(m["a"]) for m in msgs) / total
        new = {}
        for k, v in mean.items():
            if k in self.normalised:  # x <- x - tau_eff * sum_i p_i d_i, in float64
                x = self.global_params[k]
                new[k] = (x.double() - tau_eff * v.double()).to(x.dtype)
            else:
                new[k] = v
        self.global_params = new
        taus = [float(m["tau"]) for m in msgs]
        self._round = {"server/tau_eff": tau_eff, "server/tau_min": min(taus), "server/tau_max": max(taus)}

    def on_round_end(self, ctx, metrics: dict[str, Any]) -> None:
        metrics.update(self._round)
        self._round = {}


def resolve(cfg) -> None:
    if cfg.optim.name != "sgd":
        raise ConfigError(f"method.name=fednova normalises by the local SGD steps (momentum included); "
                          f"optim.name={cfg.optim.name!r} has no a_i: use optim.name=sgd")


register_method("fednova", FedNovaConfig, FedNovaClient, FedNovaServer, resolve=resolve)
