"""APFL (Deng, Kamani and Mahdavi, 2020): each client mixes a local model with the global one.

Algorithm 1 (local descent APFL) with the adaptive mixing weight of the paper, for client i at step t:

    w_i <- w_i - eta_t grad f_i(w_i)                       the local copy of the global model
    v_i <- v_i - eta_t grad_v f_i(vbar_i)                  = eta_t alpha_i grad f_i(vbar_i)
    alpha_i <- alpha_i - eta_t <v_i - w_i, grad f_i(vbar_i)>    (projected onto [0, 1])
    with vbar_i = alpha_i v_i + (1 - alpha_i) w_i, all three updates taken at the previous iterate;
    every tau steps (a round) the server averages the w_i (FedAvg).

How it maps onto this framework:
- w_i is `self.model` (shared); v_i is `self.local` (private, in the state store) and alpha_i is a
  per-client scalar in the state store (`client_state()["alpha"]`, starting at `method.alpha`).
- One backward of f_i(w_i) + f_i(vbar_i), with w_i detached inside vbar_i, gives exactly the three
  gradients above; one optimizer step moves w_i and v_i, and alpha_i takes its own SGD step with
  `method.alpha_lr` (null = the round's learning rate eta_t, as in the paper). `method.adaptive=false`
  keeps alpha_i fixed at `method.alpha`.
- Evaluation scores each client's mixed model vbar_i, built from the latest global model w and v_i
  (as after a synchronisation); `test/acc_global_micro` scores w.
- alpha = 0 (fixed) is FedAvg exactly; alpha = 1 (fixed) trains v_i as Local does.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.func import functional_call

from fl.config import ConfigError, MethodConfig, param
from fl.core import ClientModule, Server, build_optimizer, register_method
from fl.core.metric_directions import LOWER, NEITHER


@dataclass
class APFLConfig(MethodConfig):
    name: str = "apfl"
    alpha: float = param(0.25, ge=0.0, le=1.0, search={"values": [0.25, 0.5, 0.75, 1.0]},
                         help="mixing weight of the local model, vbar = alpha v + (1 - alpha) w (initial value "
                         "when adaptive)")
    adaptive: bool = param(True, help="learn alpha_i per client by gradient descent (the paper's adaptive APFL)")
    alpha_lr: Optional[float] = param(None, gt=0.0, help="step size of the alpha update; null = the round's "
                                      "learning rate eta_t")


class APFLClient(ClientModule):
    metric_directions = {"ce": LOWER, "mixed_ce": LOWER, "alpha": NEITHER}  # alpha_i: a mixing weight
    persistent = ("alpha",)  # alpha_i, per client

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        self.automatic_optimization = False
        self.local = copy.deepcopy(self.model)  # v_i; starts from w^0
        self.alpha = torch.tensor(float(self.hp.alpha))

    def is_private(self, key: str) -> bool:
        return key.startswith("local.")

    def configure_optimizers(self):
        return build_optimizer(self.cfg, list(self.model.parameters()) + list(self.local.parameters()), self.lr)

    # ---- the mixed model -------------------------------------------------------------------------
    def mixed_logits(self, x: Tensor, alpha: Tensor) -> Tensor:
        """Logits of vbar = alpha v + (1 - alpha) w; gradients reach v and alpha, never w."""
        w = dict(self.model.named_parameters())
        mixed = {k: alpha * v + (1 - alpha) * w[k].detach() for k, v in self.local.named_parameters()}
        return functional_call(self.local, mixed, (x,))  # buffers (BatchNorm statistics) are v's

    def training_step(self, batch, batch_idx):
        x, y = batch
        alpha = self.alpha.detach().requires_grad_(self.hp.adaptive)
        ce = F.cross_entropy(self.model(x), y)
        ce_mixed = F.cross_entropy(self.mixed_logits(x, alpha), y)
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(ce + ce_mixed)
        opt.step()
        if self.hp.adaptive:
            lr = self.hp.alpha_lr if self.hp.alpha_lr is not None else self.lr
            with torch.no_grad():  # <v - w, grad f(vbar)>, taken at the same iterate as the model steps
                self.alpha = (alpha - lr * alpha.grad).clamp(0.0, 1.0)
        return {"loss": (ce + ce_mixed).detach(), "ce": ce.detach(), "mixed_ce": ce_mixed.detach(),
                "alpha": self.alpha}  # a tensor: float() would wait for the GPU every step

    def predict(self, x: Tensor) -> Tensor:
        return self.model(x) if self.cid < 0 else self.mixed_logits(x, self.alpha)


def resolve(cfg) -> None:
    if cfg.method.adaptive and cfg.fabric.precision == "16-mixed":  # alpha's gradient would carry the loss scale
        raise ConfigError("method.adaptive=true needs fabric.precision 32-true, 64-true or bf16-mixed, not 16-mixed")


register_method("apfl", APFLConfig, APFLClient, Server, resolve)
