"""Per-FedAvg (Fallah, Mokhtari and Ozdaglar, NeurIPS 2020): FedAvg on the MAML objective
F_i(w) = f_i(w - alpha grad f_i(w)), so that one gradient step from the global model personalises it.

Each local step of client i, with three independent batches D, D', D'':

    temp = w - alpha grad f_i(w; D)
    g    = grad f_i(temp; D')
    FO (first order):  w <- w - beta g
    HF (Hessian-free): w <- w - beta (g - alpha d),  d = [grad f_i(w + delta g; D'') - grad f_i(w - delta g; D'')]
                                                         / (2 delta)  ~=  Hessian(w; D'') g
    server: w = weighted mean of the client models (FedAvg)

Evaluation: each client adapts the global model with `adapt_steps` (1 in the paper) plain gradient steps of
size alpha on batches of its own training data, then predicts; the adapted copy is never kept.
`test/acc_global_micro` scores the unadapted global model.

How it maps onto this framework:
- beta is the round's learning rate (`optim.lr`, its round schedule) and the outer step goes through the
  configured optimizer (`optim.momentum=0` gives the paper's plain step).
- D is the orchestrator's batch; D' and D'' are drawn (without replacement, `trainer.batch_size` each)
  from the client's training data with a generator seeded by (seed, round, client, "perfedavg/meta"), and
  they are not augmented (`data.augment` applies to D only).
- The adaptation batches at evaluation are drawn as training batches are, seeded by purpose "adapt".
- Under mixed precision the MAML gradients are float32 islands: they are values of further steps (temp, the
  finite difference of the Hessian-free variant, 58% off in bf16), not gradients the loss scaler sees, and fp16
  gradients without a loss scale underflow. The outer step reaches the optimizer scaled as 16-mixed's loss
  scaler expects. Mixed precision therefore does not speed up Per-FedAvg's training.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call

from fl.config import MethodConfig, param
from fl.core import ClientModule, Server, float32_island, generator, loss_scaler, register_method
from fl.core.metric_directions import LOWER


@dataclass
class PerFedAvgConfig(MethodConfig):
    name: str = "perfedavg"
    variant: str = param("fo", choices=["fo", "hf"], help="fo: first-order MAML gradient; hf: Hessian-free, "
                         "with a finite-difference Hessian-vector product")
    alpha: float = param(0.01, gt=0.0, search={"distribution": "log_uniform_values", "min": 1e-3, "max": 0.1},
                         help="alpha: step size of the inner (personalisation) gradient step, in training and "
                         "at evaluation")
    delta: float = param(1e-3, gt=0.0, help="HF: finite-difference step of the Hessian-vector product")
    adapt_steps: int = param(1, ge=0, help="gradient steps of size alpha each client takes before evaluation")


@float32_island
def loss_and_grad(module: torch.nn.Module, params: dict[str, Tensor], x: Tensor, y: Tensor):
    """f(params; (x, y)) and its gradient w.r.t. params, with the module's architecture."""
    params = {k: v.detach().requires_grad_(True) for k, v in params.items()}
    loss = F.cross_entropy(functional_call(module, params, (x,)), y)
    return loss.detach(), dict(zip(params, torch.autograd.grad(loss, list(params.values()))))


@float32_island
def hessian_vector_fd(module, params: dict[str, Tensor], v: dict[str, Tensor], x: Tensor, y: Tensor,
                      delta: float) -> dict[str, Tensor]:
    """[grad f(w + delta v) - grad f(w - delta v)] / (2 delta), the paper's Hessian-free estimate of H(w) v."""
    _, plus = loss_and_grad(module, {k: p + delta * v[k] for k, p in params.items()}, x, y)
    _, minus = loss_and_grad(module, {k: p - delta * v[k] for k, p in params.items()}, x, y)
    return {k: (plus[k] - minus[k]) / (2 * delta) for k in params}


class PerFedAvgClient(ClientModule):
    metric_directions = {"ce": LOWER}
    reuse_personalized = True  # the adaptation steps change the parameters only

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        self.automatic_optimization = False
        self._adapting = False

    def on_local_train_start(self) -> None:
        self._meta_gen = generator(self.cfg.seed, self.round, self.cid, "perfedavg/meta")

    def _extra_batch(self) -> tuple[Tensor, Tensor]:
        split = self.train_split(self.data, self.cid)
        n = len(split)
        idx = torch.randperm(n, generator=self._meta_gen)[:min(self.cfg.trainer.batch_size, n)]
        return self.make_batch(split, idx.to(split.y.device))

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y = batch
        if self._adapting:  # evaluation: plain gradient steps of size alpha (the optimizer is SGD(alpha))
            loss = F.cross_entropy(self.model(x), y)
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
            return {"loss": loss.detach()}
        w = {k: p.detach() for k, p in self.model.named_parameters()}
        loss, g = loss_and_grad(self.model, w, x, y)
        temp = {k: w[k] - self.hp.alpha * g[k] for k in w}
        x2, y2 = self._extra_batch()
        meta_loss, meta_g = loss_and_grad(self.model, temp, x2, y2)
        if self.hp.variant == "hf":
            x3, y3 = self._extra_batch()
            hv = hessian_vector_fd(self.model, w, meta_g, x3, y3, self.hp.delta)
            meta_g = {k: meta_g[k] - self.hp.alpha * hv[k] for k in w}
        opt.zero_grad()
        scaler = loss_scaler(self.fabric)  # 16-mixed: opt.step divides by the loss scale (a power of 2: exact)
        for k, p in self.model.named_parameters():
            p.grad = meta_g[k] if scaler is None else scaler.scale(meta_g[k])
        opt.step()
        return {"loss": meta_loss, "ce": loss}

    def personalize(self) -> None:
        if self.hp.adapt_steps == 0:
            return
        optimizer = self.fabric.setup_optimizers(torch.optim.SGD(self.model.parameters(), lr=self.hp.alpha))
        self._adapting = True
        try:
            self.fit_local(optimizer, steps=self.hp.adapt_steps, purpose="adapt")
        finally:
            self._adapting = False


register_method("perfedavg", PerFedAvgConfig, PerFedAvgClient, Server)
