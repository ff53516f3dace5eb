"""SCAFFOLD (Karimireddy et al., ICML 2020): local SGD with control variates that correct client drift.

Algorithm 1 of the paper, with option II for the client control variate:

    server state: model x and control variate c; client i keeps its own c_i (zero at the start)
    client i:     y <- x;  K times: y <- y - lr * (g_i(y) + c - c_i)
                  c_i+ <- c_i - c + (x - y) / (K * lr)          (option II)
                  send (y, delta c_i = c_i+ - c_i); keep c_i+
    server:       x <- x + eta_g * (avg_i y_i - x)
                  c <- c + (1/M) * sum_{i in round} delta c_i   (M = all clients, |S|/M * mean)

How it maps onto this framework:
- The broadcast payload carries x ("params") and c ("c"). c_i is a persistent client attribute (kept in
  the state store); a client that was never sampled has c_i = 0.
- The corrected step is a step on the gradient of the objective ce(y) + <c - c_i, y> (`client_loss`, the same
  function for the sequential loop and `trainer.parallel_clients`), which is g_i(y) + c - c_i on every controlled
  parameter; manual optimization counts the steps. K is the number of steps actually taken
  (`trainer.local_steps`, or the batches of `trainer.local_epochs` passes) and lr is the round's learning
  rate (`optim.lr`, or its `optim.round_schedule` value).
  Option II assumes plain SGD; with momentum or Adam the same correction is added to the gradient and
  the c_i update still uses (x - y) / (K * lr), as common implementations do. Under fp16 loss scaling
  (`fabric.precision=16-mixed`) the correction is scaled like the gradients, and steps the scaler skips
  are not counted in K.
- Aggregation of the models: the orchestrator averages the uploaded parameters. By default the weights
  are n_i (as FedAvg does in this framework, `method.param_weighting=samples`); the paper averages
  uniformly over the sampled clients, which `method.param_weighting=uniform` gives (weight 1.0).
- Only floating-point parameters with requires_grad get control variates (and the server step size
  eta_g = `method.server_lr`); buffers such as BatchNorm statistics are plain FedAvg averages.
- With eta_g = 1 the server step is x <- mean exactly, so round 0 (where c = c_i = 0) equals FedAvg.
- The update of c is summed in float64 in client order, so 1 and 2 processes give the same c.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fl.config import MethodConfig, param
from fl.core import ClientModule, Server, Upload, loss_scaler, register_method
from fl.core.client import cross_entropy
from fl.core.metric_directions import LOWER


@dataclass
class ScaffoldConfig(MethodConfig):
    name: str = "scaffold"
    server_lr: float = param(1.0, gt=0.0, search={"values": [0.5, 1.0, 2.0]},
                             help="global step size eta_g: x <- x + eta_g * (mean of client models - x)")
    param_weighting: str = param("samples", choices=["samples", "uniform"],
                                 help="weights of the model average: samples = n_i (FedAvg), "
                                 "uniform = 1 per sampled client (the paper)")


def controlled_keys(module: ClientModule) -> list[str]:
    """Names of the parameters that get control variates: shared, trainable, floating point."""
    return [k for k, p in module.named_parameters()
            if p.requires_grad and p.is_floating_point() and not module.is_private(k)]


class ScaffoldClient(ClientModule):
    metric_directions = {"objective": LOWER}
    persistent = ("c_i",)  # this client's control variate; empty (= 0) until its first round
    functional = True  # trainer.parallel_clients: the corrected step as the gradient of an objective

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        self.automatic_optimization = False
        self.c: dict[str, Tensor] = {}  # the server's control variate, as broadcast this round
        self.c_i: dict[str, Tensor] = {}
        self._delta_c: dict[str, Tensor] = {}
        self._steps = 0

    # ---- communication ----------------------------------------------------------------------------
    def receive(self, payload: dict[str, Any]) -> None:
        super().receive(payload)
        self.c = payload.get("c") or {}

    def upload(self) -> Upload:
        up = super().upload()
        up.message = {"delta_c": {k: v.detach().cpu() for k, v in self._delta_c.items()}}
        return up

    # ---- local training -----------------------------------------------------------------------
    def _controlled(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(k, p) for k, p in self.named_parameters() if k in self.c]

    def on_local_train_start(self) -> None:
        params = self._controlled()
        self.c_i = {k: self.c_i[k].to(p.device, p.dtype) if k in self.c_i else torch.zeros_like(p, requires_grad=False)
                    for k, p in params}
        self._x = {k: p.detach().clone() for k, p in params}  # the global model received this round
        self._correction = {k: (self.c[k].to(p.device, p.dtype) - self.c_i[k]) for k, p in params}
        self._delta_c = {}
        self._steps = 0
        self._skipped = torch.zeros((), device=self.device)  # steps the loss scaler skipped, counted on the device

    def training_step(self, batch, batch_idx):
        out = self.client_loss(self, self.parameters_by_name(), self.loss_inputs(), batch)
        opt = self.optimizers()
        opt.zero_grad()
        # the gradient of the objective is g_i(y) + c - c_i; under 16-mixed the backward scales the whole objective,
        # so the correction carries the loss scale as the gradients do, and opt.step unscales both
        self.manual_backward(out["objective"])
        scaler = loss_scaler(self.fabric)
        scale = scaler.scale(torch.ones((), device=self._skipped.device)) if scaler is not None else None  # no sync
        opt.step()
        self._steps += 1
        if scale is not None:  # a step with non-finite gradients is skipped and lowers the scale: not counted in K
            self._skipped += scaler.scale(torch.ones_like(scale)) < scale
        return {"loss": out["loss"].detach()}

    def loss_inputs(self):
        return {"correction": self._correction}

    def client_loss(self, forward, params, inputs, batch, mask=None):
        """Algorithm 1's corrected local step y <- y - lr (g_i(y) + c - c_i), g_i the gradient of the client's
        cross-entropy, is a step on the gradient of the objective ce(y) + <c - c_i, y>; 'loss' (logged) is the
        cross-entropy alone. One definition for training_step and the vmapped step."""
        x, y = batch
        ce = cross_entropy(forward(x), y, mask)
        drift = sum(torch.sum(c * params[k]) for k, c in inputs["correction"].items())
        return {"loss": ce, "objective": ce + drift}

    def functional_train_end(self, steps: int) -> None:
        self._steps = steps  # K of option II: the vmapped loop took them all (no loss scaler there)
        self.on_local_train_end()

    def on_local_train_end(self) -> None:
        if loss_scaler(self.fabric) is not None:
            self._steps -= int(self._skipped)  # the one host sync of the loss-scale bookkeeping, per client
        if self._steps == 0:  # no step taken: c_i stays, nothing to add to c
            return
        scale = 1.0 / (self._steps * self.lr)
        with torch.no_grad():
            new = {k: self.c_i[k] - self.c[k].to(p.device, p.dtype) + (self._x[k] - p.detach()) * scale
                   for k, p in self._controlled()}  # option II
        self._delta_c = {k: new[k] - self.c_i[k] for k in new}
        self.c_i = new
        self._x = {}
        self._correction = {}


class ScaffoldServer(Server):
    def setup(self, module: ClientModule, data) -> None:
        super().setup(module, data)
        self.control = {k: torch.zeros_like(self.global_params[k]) for k in controlled_keys(module)
                        if k in self.global_params}

    def broadcast(self, cid: int) -> dict[str, Any]:
        return {"params": self.global_params, "c": self.control}

    def weight(self, cid: int, upload: Upload) -> float:
        return 1.0 if self.hp.param_weighting == "uniform" else upload.weight

    def server_step(self, ctx, mean: dict[str, Tensor], messages: dict[int, dict]) -> None:
        if mean:  # x <- x + eta_g (mean - x) on the controlled parameters; buffers take the plain average
            self.global_params = self.step_towards(mean, float(self.hp.server_lr), set(self.control))
        # c <- c + (1/M) sum_i delta c_i, summed in float64 in client order
        sums: dict[str, Tensor] = {}
        for cid in sorted(messages):
            for k, d in (messages[cid] or {}).get("delta_c", {}).items():
                d = d.detach().to(torch.float64)
                sums[k] = sums[k] + d if k in sums else d.clone()
        m = float(self.data.num_clients)
        for k, s in sums.items():
            c = self.control[k]
            self.control[k] = (c.double() + s.to(c.device) / m).to(c.dtype)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["control"] = {k: v.cpu() for k, v in self.control.items()}
        return state

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        super().load_state_dict(state, device)
        self.control = {k: v.to(device) for k, v in state["control"].items()}


register_method("scaffold", ScaffoldConfig, ScaffoldClient, ScaffoldServer)
