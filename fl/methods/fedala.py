"""FedALA (Zhang et al., AAAI 2023): each client starts a round from an adaptive, element-wise mix of its old local
model and the global model (Adaptive Local Aggregation, ALA) instead of the global model alone; the server is FedAvg.

The paper's client update (Sec. "Adaptive Local Aggregation", Eqs. 3-6; Algorithm 1, lines 6-17), for client i in
round t with received global model Theta^{t-1} and its old local model Theta_i^{t-1}:

    Theta_hat_i = Theta_i^{t-1} + (Theta^{t-1} - Theta_i^{t-1}) (.) [1, ..., 1, W_i^p]          (Eq. 4)
                  the lower layers take the global model's values, the p higher layers mix element-wise
    W_i^p      <- clip_[0,1]( W_i^p - eta grad_{W_i^p} L(Theta_hat_i, D_i^{s,t}) )               (Eq. 5 and clipping)
                  grad_W L = grad_{Theta_hat} L (.) (Theta^{t-1} - Theta_i^{t-1})            (Eq. 6, on the p layers)
                  D_i^{s,t}: s% of the client's training data, drawn at random each round
    start phase:  the first time a client runs ALA, W_i^p (all ones) is trained until it converges; afterwards it
                  is reused and trained one pass per round (Algorithm 1, "t = 2" and "t > 2")
    then:         local training from Theta_hat_i (Algorithm 1, line 16), upload, FedAvg (line 19)

How it maps onto this framework:
- Theta_i is `self.local` (private, in the state store; every client starts from Theta^0, Algorithm 1, line 1) and W_i
  and the start-phase flag are persistent attributes, so checkpoints, resume and 1-vs-2 processes carry them.
  `self.model` receives the global model, becomes Theta_hat_i in `on_local_train_start`, trains and is uploaded;
  after training it is copied into `self.local`.
- A "layer" is a module owning parameters (a convolution or linear layer with its bias, a normalisation layer's
  affine), counted from the output end in the model's registration order; p = 1 is the classifier head. p at least
  the model's number of layers mixes the entire model. (The authors' code counts parameter tensors: its
  layer_idx = 2 is the head's weight and bias, the paper's p = 1.)
- ALA is skipped while the local model equals the global model on the p layers (the first round: every W gives the
  global model, the paper's t = 1). Buffers (BatchNorm statistics) take the global model's values, as the lower layers
  do; the paper mixes parameters only.
- Each W step is one mini-batch (trainer.batch_size) of one pass over D_i^{s,t}, in train mode with the training
  augmentation and BatchNorm statistics left untouched; the pass has its own seeded draws and leaves torch's RNG as
  local training finds it. The paper writes Eq. 5 on D_i^{s,t} and the authors' code steps per mini-batch of it.
- Convergence in the start phase (the paper is silent on the test): the authors' code's rule. Each pass records the
  loss of its last mini-batch; W has converged once more than `num_pre_loss` passes are recorded and the population
  std of the last `num_pre_loss` is below `threshold` (0.1, the default their client runs with; their README cites
  0.01). At most `max_start_passes` passes (a cap the paper does not have; the authors warn a small threshold can hang).
- Evaluation scores each client's local model after its local training (`self.local`); `test/acc_global_micro` scores
  the global model. A client that has not trained yet is scored with Theta^0.
- eta = 0 keeps W_i = 1: the lower layers and the p layers are the global model's, so the run is FedAvg's exactly.
- Logged per client: `ala_passes` (W passes this round, 0 when ALA is skipped) and `w_mean` (mean of W_i^p).
- Under mixed precision the W passes are a float32 island: W's gradient steps W directly, not through 16-mixed's
  loss scaler, and a float16 gradient without a loss scale underflows.
"""
from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from fl.config import ConfigError, MethodConfig, param
from fl.core import (
    ClientModule,
    Server,
    batch_indices,
    build_optimizer,
    float32_island,
    generator,
    register_method,
    seed_torch,
)
from fl.core.metric_directions import NEITHER
from fl.methods.fedsam import frozen_running_stats


@dataclass
class FedALAConfig(MethodConfig):
    name: str = "fedala"
    eta: float = param(1.0, ge=0.0, search={"values": [0.1, 0.5, 1.0, 2.0]},
                       help="eta: learning rate of the ALA weights W_i (Eq. 5); 0 keeps W_i = 1 (FedAvg)")
    s: float = param(80.0, gt=0.0, le=100.0, search={"values": [5, 20, 40, 80, 100]},
                     help="s: percent of the client's training data drawn each round to learn W_i")
    p: int = param(1, ge=1, search={"values": [1, 2, 3]},
                   help="p: number of higher layers ALA mixes (modules owning parameters, counted from the output; "
                   "1 = the head); the lower layers take the global model")
    threshold: float = param(0.1, gt=0.0, help="start phase: W_i has converged when the std of the last "
                             "num_pre_loss passes' last-batch losses is below this (0.1: the authors' code, whose "
                             "client never sets it; their README cites 0.01)")
    num_pre_loss: int = param(10, ge=2, help="start phase: passes whose losses the convergence test looks at (it "
                              "needs more passes than this, as the authors' code)")
    max_start_passes: int = param(100, ge=1, help="start phase: at most this many passes over the sample "
                                  "(a cap the paper does not have)")


# ---- ALA on tensors: Eqs. 4-6 --------------------------------------------------------------------------------------
def mixed_keys(model: nn.Module, p: int) -> list[str]:
    """Parameter names of the p higher layers: the last p modules (in registration order) that own parameters."""
    layers = [(name, [k for k, _ in mod.named_parameters(recurse=False)]) for name, mod in model.named_modules()]
    layers = [(name, ks) for name, ks in layers if ks]
    return [f"{name}.{k}" if name else k for name, ks in layers[-p:] for k in ks]


def ala_init(local: Mapping[str, Tensor], glob: Mapping[str, Tensor], W: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Theta_hat (Eq. 4): the global value of every tensor outside W, local + (global - local) (.) W on W's keys.
    torch.lerp is exact at both ends: W = 1 gives the global tensor bit for bit, W = 0 the local one."""
    return {k: torch.lerp(local[k], g, W[k]) if k in W else g for k, g in glob.items()}


@float32_island
def weight_gradients(model: nn.Module, local: Mapping[str, Tensor], glob: Mapping[str, Tensor],
                     W: Mapping[str, Tensor], x: Tensor, y: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """The cross-entropy of Theta_hat on (x, y) and its gradient w.r.t. W (Eq. 6): autograd through the mix,
    grad_{Theta_hat} L (.) (global - local). The model's own parameters outside W (the lower layers, which hold the
    global model) are constants of the pass."""
    leaves = {k: w.detach().requires_grad_(True) for k, w in W.items()}
    mixed = {k: torch.lerp(local[k].detach(), glob[k].detach(), w) for k, w in leaves.items()}
    loss = F.cross_entropy(functional_call(model, mixed, (x,)), y)
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return loss.detach(), dict(zip(leaves, grads))


def weight_step(W: Mapping[str, Tensor], grads: Mapping[str, Tensor], eta: float) -> dict[str, Tensor]:
    """Eq. 5 and the clipping: W <- clip(W - eta grad, 0, 1), element-wise."""
    return {k: (w - eta * grads[k]).clamp_(0.0, 1.0) for k, w in W.items()}


def converged(losses: list[float], window: int, threshold: float) -> bool:
    """The start phase's stopping rule (the authors' code): more than `window` passes recorded, and the last `window`
    of the per-pass losses (each pass's last mini-batch loss) vary (population std) less than `threshold`."""
    return len(losses) > window and float(np.std(losses[-window:])) < threshold


# ---- the client ----------------------------------------------------------------------------------------------------
class FedALAClient(ClientModule):
    metric_directions = {"ala_passes": NEITHER, "w_mean": NEITHER}  # the weight learning: diagnostics
    persistent = ("W", "start_phase")

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        self.local = copy.deepcopy(self.model)  # Theta_i; Theta^0 until the client first trains (Algorithm 1, line 1)
        params = dict(self.model.named_parameters())
        self.W = {k: torch.ones_like(params[k]) for k in mixed_keys(self.model, int(self.hp.p))}  # W_i^p: ones
        self.start_phase = True  # until the client's first ALA
        self._logs: dict[str, float] = {}

    def is_private(self, key: str) -> bool:
        return key.startswith("local.")

    def configure_optimizers(self):
        return build_optimizer(self.cfg, self.model.parameters(), self.lr)  # Theta_hat trains; Theta_i is a copy

    # ---- Adaptive Local Aggregation -------------------------------------------------------------------------
    def on_local_train_start(self) -> None:
        """Theta_hat_i into self.model, which holds the received global model."""
        glob = {k: v.detach().clone() for k, v in self.model.named_parameters() if k in self.W}
        local = {k: v.detach() for k, v in self.local.named_parameters() if k in self.W}
        passes = 0
        if any(not torch.equal(local[k], glob[k]) for k in self.W):  # else every W gives the global model (t = 1)
            if self.hp.eta > 0:
                passes = self.learn_weights(local, glob)
            with torch.no_grad():
                for k, v in ala_init(local, glob, self.W).items():
                    self.model.get_parameter(k).copy_(v)
        w = torch.cat([v.flatten() for v in self.W.values()])
        self._logs = {"ala_passes": float(passes), "w_mean": float(w.double().mean())}

    def learn_weights(self, local: dict[str, Tensor], glob: dict[str, Tensor]) -> int:
        """W_i^p by Eq. 5 on a fresh s% sample: until convergence in the start phase, one pass afterwards. Returns the
        number of passes."""
        seed, rnd, cid, t = self.cfg.seed, self.round, self.cid, self.cfg.trainer
        train = self.train_split(self.data, cid)
        n = len(train)
        if n == 0:
            return 0
        k = max(1, int(n * self.hp.s / 100))
        sample = torch.randperm(n, generator=generator(seed, rnd, cid, "fedala/sample"))[:k].to(train.y.device)
        gen = generator(seed, rnd, cid, "fedala/batches")
        aug = generator(seed, rnd, cid, "fedala/augment") if self.cfg.data.augment else None
        budget = self.hp.max_start_passes if self.start_phase else 1
        device = next(self.parameters()).device
        losses: list[float] = []  # per pass: the loss of its last mini-batch (the authors' code records that)
        last = None
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), frozen_running_stats(self):
            seed_torch(seed, rnd, cid, "fedala")  # dropout draws of the W passes; training's RNG is restored after
            for _, idx in batch_indices(k, t.batch_size, gen, epochs=budget, drop_last=t.drop_last):
                if idx is None:  # a pass over D_i^{s,t} is complete
                    losses.append(float(last))
                    if not self.start_phase or converged(losses, self.hp.num_pre_loss, self.hp.threshold):
                        break
                    continue
                x, y = self.make_batch(train, sample[idx], aug)
                loss, grads = weight_gradients(self.model, local, glob, self.W, x, y)
                self.W = weight_step(self.W, grads, float(self.hp.eta))
                last = loss
        self.start_phase = False
        return len(losses)

    # ---- local training and evaluation ------------------------------------------------------------------------
    def training_step(self, batch, batch_idx):
        x, y = batch
        return {"loss": F.cross_entropy(self.model(x), y), **self._logs}

    def on_local_train_end(self) -> None:
        self.local.load_state_dict(self.model.state_dict())  # the trained local model Theta_i^t, kept by the client

    def predict(self, x: Tensor) -> Tensor:
        return self.model(x) if self.cid < 0 else self.local(x)


def resolve(cfg) -> None:
    if cfg.finetune.after_round is not None:
        raise ConfigError("finetune.after_round: method fedala keeps each client's local model already; its local "
                          "fine-tuning rounds are not defined (use finetune.after_round=null)")


register_method("fedala", FedALAConfig, FedALAClient, Server, resolve)
