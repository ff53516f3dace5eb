"""pFedMe (Dinh, Tran and Nguyen, NeurIPS 2020): personalized FL with Moreau envelopes.

Algorithm 1 of the paper. Client i receives w^t and sets w_i = w^t; for each of its R local steps:

    draw a batch D
    theta_i ~= argmin_theta  f_i(theta; D) + lam/2 ||theta - w_i||^2     (K gradient steps, rate personal_lr)
    w_i <- w_i - eta lam (w_i - theta_i)                                   (a step on the Moreau envelope)

and the server takes w^{t+1} = (1 - beta) w^t + beta * mean_i w_i.

How it maps onto this framework:
- w_i is `self.model` (shared); theta_i is `self.personal`, private and kept per client in the state store.
  theta_i starts each round from w^t and is warm-started across the round's inner problems, as in the
  authors' code; the one stored is the last inner solution, and it is what evaluation scores
  (`test/acc_global_micro` scores w).
- The inner problem is plain gradient descent (`solve_inner`); the outer step sets w_i.grad =
  lam (w_i - theta_i) and steps the configured optimizer with the round's learning rate eta, so
  `optim.momentum=0 optim.weight_decay=0` gives the paper's exact update.
- R is the round's local steps (`trainer.local_steps`, or the batches of `trainer.local_epochs`).
- The paper lets every client compute its update and aggregates a sampled subset; here, as for every
  method of this framework, only the round's sampled clients train (the same under full participation).
- BatchNorm statistics are theta's (its forward passes are the only ones); they are uploaded with w_i.
- Under mixed precision the inner problem is a float32 island: its gradients step theta directly, not through
  the loss scaler, and fp16 gradients without a loss scale underflow. The outer gradient reaches the optimizer
  scaled as 16-mixed's loss scaler expects. Mixed precision therefore does not speed up pFedMe's training.
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from fl.config import MethodConfig, param
from fl.core import ClientModule, Server, build_optimizer, float32_island, loss_scaler, register_method
from fl.core.metric_directions import NEITHER


@dataclass
class PFedMeConfig(MethodConfig):
    name: str = "pfedme"
    lam: float = param(15.0, gt=0.0, search={"values": [1.0, 5.0, 10.0, 15.0]},
                       help="lambda: weight of lam/2 ||theta - w||^2 in the Moreau envelope")
    K: int = param(5, ge=1, search={"values": [1, 5, 10]}, help="gradient steps on each inner problem")
    personal_lr: float = param(0.01, gt=0.0, search={"distribution": "log_uniform_values", "min": 1e-3, "max": 0.1},
                               help="step size of the inner gradient descent on theta")
    beta: float = param(1.0, gt=0.0, search={"values": [1.0, 2.0]},
                        help="server step: w <- (1 - beta) w + beta * mean of the client models")


@float32_island
def solve_inner(theta: list[Tensor], w: list[Tensor], loss_fn: Callable[[], Tensor], lam: float, lr: float,
                steps: int) -> tuple[Tensor, Tensor]:
    """`steps` gradient steps on h(theta) = loss_fn() + lam/2 ||theta - w||^2, in place on the leaf tensors
    `theta` (loss_fn evaluates the model that owns them). Returns the last loss and ||grad h|| at the last
    iterate the gradient was taken at."""
    for _ in range(steps):
        loss = loss_fn()
        grads = torch.autograd.grad(loss, theta)
        with torch.no_grad():
            full = [g + lam * (t - wi) for g, t, wi in zip(grads, theta, w)]
            for t, g in zip(theta, full):
                t.sub_(g, alpha=lr)
    norm = torch.sqrt(sum(torch.sum(g * g) for g in full))
    return loss.detach(), norm


class PFedMeClient(ClientModule):
    metric_directions = {"inner_grad_norm": NEITHER}  # how far the inner solve got: a diagnostic

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        self.automatic_optimization = False
        self.personal = copy.deepcopy(self.model)  # theta_i

    def is_private(self, key: str) -> bool:
        return key.startswith("personal.")

    def configure_optimizers(self):
        return build_optimizer(self.cfg, self.model.parameters(), self.lr)  # the outer step on w only

    def on_local_train_start(self) -> None:
        self.personal.load_state_dict(self.model.state_dict())  # theta starts the round at w^t

    def training_step(self, batch, batch_idx):
        x, y = batch
        w = list(self.model.parameters())
        theta = list(self.personal.parameters())
        loss, grad_norm = solve_inner(theta, [p.detach() for p in w], lambda: F.cross_entropy(self.personal(x), y),
                                      self.hp.lam, self.hp.personal_lr, self.hp.K)
        opt = self.optimizers()
        opt.zero_grad()
        scaler = loss_scaler(self.fabric)  # 16-mixed: opt.step divides by the loss scale (a power of 2: exact)
        with torch.no_grad():
            for p, t in zip(w, theta):  # grad of the Moreau envelope: lam (w - theta(w))
                g = self.hp.lam * (p.detach() - t.detach())
                p.grad = g if scaler is None else scaler.scale(g)
        opt.step()
        return {"loss": loss, "inner_grad_norm": grad_norm}

    def on_local_train_end(self) -> None:
        with torch.no_grad():
            for (_, b), (_, pb) in zip(self.model.named_buffers(), self.personal.named_buffers()):
                b.copy_(pb)

    def predict(self, x: Tensor) -> Tensor:
        return self.model(x) if self.cid < 0 else self.personal(x)


class PFedMeServer(Server):
    def server_step(self, ctx, mean: dict[str, Tensor], messages: dict[int, dict]) -> None:
        if mean:  # w <- (1 - beta) w + beta * mean = w + beta (mean - w)
            self.global_params = self.step_towards(mean, float(self.hp.beta))


register_method("pfedme", PFedMeConfig, PFedMeClient, PFedMeServer)
