"""CReFF (Shang, Lu, Huang and Wang, IJCAI 2022, "Federated Learning on Heterogeneous and Long-Tailed Data via
Classifier Re-Training with Federated Features"): the global model's backbone is FedAvg's, and its classifier is
re-trained on the server on learnable "federated features", optimised so that the classifier's gradient on them
matches the gradient the clients' real features produce.

The method (the paper's method section and its framework figure), with phi^t the re-trained classifier (W, b) of
round t and F_c the federated features of class c (num_of_feature vectors in the backbone's feature space):

    server -> clients:  the FedAvg global model w^t and the re-trained classifier phi^t
    client k:           local training exactly as FedAvg (cross-entropy, E epochs) from w^t; and the real feature
                        gradients  g_{k,c} = d CE(phi^t(f_{w^t}(x)), c) / d phi  averaged over the client's samples
                        of each class c it holds (features f of the received backbone, eval mode)
    server:             w^{t+1} = FedAvg of the local models
                        g_c = mean over the round's clients holding class c of g_{k,c}  (aggregated real gradient)
                        match_epoch SGD steps (lr_feature) on the federated features of
                            L = sum_c D(d CE(phi^t(F_c), c) / d phi, g_c)
                            D(a, b) = sum over the gradient's rows i (each class's weight row, then the bias as one
                                      row) of 1 - <a_i, b_i> / (||a_i|| ||b_i||)       (gradient matching distance)
                        phi^{t+1} = a linear classifier trained on all federated features with cross-entropy:
                                    crt_epoch epochs of SGD (lr_net, batches of crt_batch_size)
    inference:          the backbone of w^{t+1} with the re-trained classifier phi^{t+1}

How it maps onto this framework:
- The broadcast to a training client is the FedAvg global model (its averaged head included) plus phi^t under
  "crt_head"; the client computes its real gradients in `on_local_train_start`, from the model as received and before
  any step, in one eval-mode pass without augmentation that draws no random numbers, so the local training and the
  uploaded parameters are FedAvg's bitwise. The gradients of the classes it holds travel in the upload's message.
- Evaluation uses the re-trained classifier with no change to the core: `broadcast(-1)` (the global model scored on
  the pooled test set and by the evaluators) carries phi^{t+1} in place of the FedAvg head, and a client's own
  evaluation swaps phi^{t+1} into its model in `personalize` (not in fine-tuning rounds, where the client's
  fine-tuned model is scored). The FedAvg head keeps training on the clients (the authors' code sends the FedAvg
  model back and evaluates the re-trained one).
- The per-class CE gradient of a linear classifier is taken in closed form, d/dW = (softmax - onehot)^T z / n and
  d/db = mean(softmax - onehot), batched over the classes: the same gradient as autograd of the CE
  (tests/methods/test_baselines_creff.py checks it), and the gradient matching stays differentiable in the features.
- The server state is the federated features and phi (state_dict), so checkpoints and resume carry them. The
  features start as standard normal draws (the authors' code: torch.randn), seeded by (seed, 0, -1,
  "creff/features"); phi^0 is the initial model's head (the code draws a fresh nn.Linear, the same distribution).
  The re-training's batch order and its fresh initialisation (crt_init=random, nn.Linear's default U(+-1/sqrt(d)))
  are seeded by (seed, round, -1, purpose).
- The aggregation is summed in float64 in client order, so 1 and 2 processes agree.

Where the paper could not be checked here (its full text was not available) the authors' released code decided,
one line each: the real gradients use phi^t on the received backbone before local training; g_c averages the clients
holding class c uniformly (grad_weighting=clients; =samples weights them by n_{k,c}, which the clients then upload);
the distance is the code's per-row 1 - cos with 1e-6 added to the norms' product; phi is re-trained from a fresh
random classifier every round (crt_init=random; =aggregated starts from the round's FedAvg head); the re-training
batch size is the local batch size (crt_batch_size=null). Unlike the code, the real gradient is the mean over all of
a client's samples of the class (the code averages 10 draws of 32 samples under differentiable augmentation).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fl.config import ConfigError, MethodConfig, param
from fl.core import HEAD, ClientModule, Server, Upload, batch_indices, generator, register_method
from fl.core.metric_directions import LOWER, NEITHER

WEIGHT, BIAS = HEAD + "weight", HEAD + "bias"
EPS = 1e-6  # added to the product of the norms in the matching distance (the authors' code)


@dataclass
class CReFFConfig(MethodConfig):
    name: str = "creff"
    num_of_feature: int = param(100, ge=1, search={"values": [10, 50, 100, 200]},
                                help="federated features per class (the authors' ipc / num_of_feature)")
    match_epoch: int = param(100, ge=0, search={"values": [50, 100, 200]},
                             help="SGD steps on the federated features per round (gradient matching)")
    crt_epoch: int = param(300, ge=1, search={"values": [100, 300, 500]},
                           help="epochs of classifier re-training on the federated features per round")
    lr_feature: float = param(0.1, gt=0.0, search={"values": [0.01, 0.1, 1.0]},
                              help="learning rate of the federated features' SGD")
    lr_net: float = param(0.01, gt=0.0, search={"values": [0.001, 0.01, 0.1]},
                          help="learning rate of the classifier re-training's SGD")
    crt_batch_size: Optional[int] = param(None, ge=1, search={"values": [32, 64, 128]},
                                          help="batch size of the re-training; null = trainer.batch_size (the "
                                          "authors' code re-trains with the local batch size)")
    crt_init: str = param("random", choices=["random", "aggregated"],
                          help="the re-trained classifier starts each round from a fresh random linear layer (the "
                          "authors' code) or from the round's FedAvg head")
    grad_weighting: str = param("clients", choices=["clients", "samples"],
                                help="g_c averages the clients holding class c uniformly (the authors' code) or "
                                "weighted by their counts n_{k,c} (then uploaded with the gradients)")


# ---- the pieces of the method, as functions of tensors (the tests compute them by hand) ----------------------------
def ce_head_gradients(weight: Tensor, bias: Tensor, z: Tensor, label: Tensor) -> tuple[Tensor, Tensor]:
    """Gradient of the mean cross-entropy of the linear classifier (W [C, d], b [C]) on features z [..., n, d] that
    all have class `label` [...]: (dW [..., C, d], db [..., C]) = ((p - e_label)^T z / n, mean(p - e_label))."""
    p = torch.softmax(z @ weight.T + bias, dim=-1)
    r = p - F.one_hot(label, weight.shape[0]).to(p.dtype).unsqueeze(-2)
    return r.transpose(-1, -2) @ z / z.shape[-2], r.mean(-2)


def match_distance(gw: Tensor, gb: Tensor, gw_real: Tensor, gb_real: Tensor) -> Tensor:
    """The gradient matching distance per class [...]: the sum of 1 - cos over the rows of the weight gradients
    ([..., C, d]) plus 1 - cos of the bias gradients ([..., C])."""
    def one_minus_cos(a: Tensor, b: Tensor) -> Tensor:
        return 1.0 - (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1) + EPS)

    return one_minus_cos(gw, gw_real).sum(-1) + one_minus_cos(gb, gb_real)


def aggregate_gradients(messages: list[dict[str, Tensor]], num_classes: int, dim: int, weighting: str,
                        device=None) -> tuple[Tensor, Tensor, Tensor]:
    """(classes [K], g_W [K, C, d], g_b [K, C]): for each class some message holds, the mean of its clients' real
    gradients, each client weighing 1 (weighting=clients) or its count n_{k,c} (samples); float64, in message order."""
    C = num_classes
    sw = torch.zeros(C, C, dim, dtype=torch.float64, device=device)
    sb = torch.zeros(C, C, dtype=torch.float64, device=device)
    total = torch.zeros(C, dtype=torch.float64, device=device)
    for m in messages:
        classes = m["classes"].to(device)
        w = (m["counts"].to(device, torch.float64) if weighting == "samples"
             else torch.ones(len(classes), dtype=torch.float64, device=device))
        sw.index_add_(0, classes, w[:, None, None] * m["grad_weight"].to(device, torch.float64))
        sb.index_add_(0, classes, w[:, None] * m["grad_bias"].to(device, torch.float64))
        total.index_add_(0, classes, w)
    classes = torch.nonzero(total > 0).flatten()
    t = total[classes]
    return classes, sw[classes] / t[:, None, None], sb[classes] / t[:, None]


def update_features(features: Tensor, weight: Tensor, bias: Tensor, classes: Tensor, gw_real: Tensor,
                    gb_real: Tensor, steps: int, lr: float) -> tuple[Tensor, list[float]]:
    """`steps` SGD steps (lr) on the federated features [C, m, d] of `classes` minimising the summed matching
    distance between their CE gradient at the classifier (weight, bias) and the aggregated real one; returns the new
    features and the loss before each step."""
    feats = features.detach().clone().requires_grad_(True)
    if steps == 0 or len(classes) == 0:
        return feats.detach(), []
    opt = torch.optim.SGD([feats], lr=lr)
    W, b = weight.detach(), bias.detach()
    gw_real, gb_real = gw_real.to(feats.dtype), gb_real.to(feats.dtype)
    losses = []
    for _ in range(steps):
        gw, gb = ce_head_gradients(W, b, feats[classes], classes)
        loss = match_distance(gw, gb, gw_real, gb_real).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return feats.detach(), [float(v) for v in losses]


def linear_init(num_classes: int, dim: int, gen: torch.Generator, dtype=torch.float32, device=None) -> dict:
    """A fresh linear classifier as nn.Linear initialises one: W and b uniform in (-1/sqrt(d), 1/sqrt(d))."""
    bound = 1.0 / math.sqrt(dim)
    w = (torch.rand(num_classes, dim, generator=gen, dtype=torch.float64) * 2 - 1) * bound
    b = (torch.rand(num_classes, generator=gen, dtype=torch.float64) * 2 - 1) * bound
    return {"weight": w.to(device, dtype), "bias": b.to(device, dtype)}


def retrain_classifier(features: Tensor, init: dict[str, Tensor], epochs: int, lr: float, batch_size: int,
                       gen: torch.Generator) -> tuple[dict[str, Tensor], float]:
    """A linear classifier trained from `init` with cross-entropy on the federated features [C, m, d] (class c's
    features labelled c): `epochs` shuffled passes (batch order from `gen`) of plain SGD; returns it and the mean
    loss of its last epoch."""
    C, m, d = features.shape
    x = features.detach().reshape(C * m, d)
    y = torch.arange(C, device=x.device).repeat_interleave(m)
    W = init["weight"].detach().clone().requires_grad_(True)
    b = init["bias"].detach().clone().requires_grad_(True)
    opt = torch.optim.SGD([W, b], lr=lr)
    total, steps, last = torch.zeros((), device=x.device), 0, 0.0
    for _, idx in batch_indices(C * m, batch_size, gen, epochs=epochs):
        if idx is None:  # end of an epoch
            last, total, steps = float(total) / max(steps, 1), torch.zeros((), device=x.device), 0
            continue
        idx = idx.to(x.device)
        loss = F.cross_entropy(F.linear(x[idx], W, b), y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        total, steps = total + loss.detach(), steps + 1
    return {"weight": W.detach(), "bias": b.detach()}, last


# ---- client ----------------------------------------------------------------------------------------------------------
class CReFFClient(ClientModule):
    needs_backbone = True

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        if not isinstance(self.model.head, nn.Linear):
            raise ConfigError(f"method.name=creff re-trains a linear classifier; model.name={cfg.model.name!r} has "
                              f"a {type(self.model.head).__name__} head: use a model with a linear head")
        self._crt: dict[str, Tensor] = {}  # phi^t, as received (not a module: stays out of state_dict)
        self._gradients: dict[str, Tensor] = {}

    def receive(self, payload: dict[str, Any]) -> None:
        super().receive(payload)
        self._crt = payload.get("crt_head") or {}

    def on_local_train_start(self) -> None:
        self._gradients = self.real_feature_gradients()  # the received model, before any local step

    def real_feature_gradients(self) -> dict[str, Tensor]:
        """The classes this client holds and, for each, the gradient of the mean CE of phi^t on the received
        backbone's features of its samples of that class (one eval-mode pass over its training split); the counts
        too when grad_weighting=samples."""
        zs, ys = [], []
        for z, y in self.eval_pass(self.train_split(self.data, self.cid), self.model.backbone):
            zs.append(z.double())
            ys.append(y)
        z, y = torch.cat(zs), torch.cat(ys)
        W = self._crt["weight"].to(z.device, torch.float64)
        b = self._crt["bias"].to(z.device, torch.float64)
        classes = torch.unique(y)  # sorted
        grads = [ce_head_gradients(W, b, z[y == c], c) for c in classes]
        dtype = self._crt["weight"].dtype  # sent in the model's precision; the server sums in float64
        message = {"classes": classes.cpu(),
                   "grad_weight": torch.stack([g[0] for g in grads]).to(dtype),
                   "grad_bias": torch.stack([g[1] for g in grads]).to(dtype)}
        if self.hp.grad_weighting == "samples":
            message["counts"] = torch.bincount(y, minlength=self.num_classes)[classes].to(dtype)
        return message

    def upload(self) -> Upload:
        up = super().upload()  # the whole local model, as FedAvg
        up.message, self._gradients = self._gradients, {}
        return up

    def personalize(self) -> None:
        """A client's evaluation scores the global model as CReFF infers with it: the re-trained classifier."""
        if self._crt and not self.finetuning:
            self.load_state_dict({WEIGHT: self._crt["weight"], BIAS: self._crt["bias"]}, strict=False)
        return None


# ---- server ----------------------------------------------------------------------------------------------------------
class CReFFServer(Server):
    metric_directions = {"server/matched_classes": NEITHER, "server/crt_loss": LOWER, "server/match_loss_first": LOWER,
                         "server/match_loss_last": LOWER}

    def setup(self, module: ClientModule, data) -> None:
        super().setup(module, data)
        W = self.global_params[WEIGHT]
        C, d = W.shape
        gen = generator(self.cfg.seed, 0, -1, "creff/features")
        self.features = torch.randn(C, self.hp.num_of_feature, d, generator=gen, dtype=W.dtype).to(W.device)
        self.crt_head = {"weight": W.clone(), "bias": self.global_params[BIAS].clone()}  # phi^0: the initial head
        self._round: dict[str, float] = {}

    def broadcast(self, cid: int) -> dict[str, Any]:
        if cid < 0:  # the global model as CReFF infers with it: the FedAvg backbone, the re-trained classifier
            params = {**self.global_params, WEIGHT: self.crt_head["weight"], BIAS: self.crt_head["bias"]}
            return {"params": params, "crt_head": self.crt_head}
        return {"params": self.global_params, "crt_head": self.crt_head}

    def server_step(self, ctx, mean: dict[str, Tensor], messages: dict[int, dict]) -> None:
        if mean:
            self.global_params = mean  # w^{t+1}: FedAvg
        hp, W = self.hp, self.crt_head["weight"]
        C, d = W.shape
        msgs = [messages[c] for c in sorted(messages) if messages[c]]
        classes, gw_real, gb_real = aggregate_gradients(msgs, C, d, hp.grad_weighting, device=W.device)
        self.features, losses = update_features(self.features, W, self.crt_head["bias"], classes, gw_real, gb_real,
                                                hp.match_epoch, hp.lr_feature)
        if hp.crt_init == "random":
            init = linear_init(C, d, generator(self.cfg.seed, ctx.round, -1, "creff/crt_init"), W.dtype, W.device)
        else:
            init = {"weight": self.global_params[WEIGHT], "bias": self.global_params[BIAS]}
        batch = hp.crt_batch_size or self.cfg.trainer.batch_size
        self.crt_head, crt_loss = retrain_classifier(self.features, init, hp.crt_epoch, hp.lr_net, batch,
                                                     generator(self.cfg.seed, ctx.round, -1, "creff/crt"))
        self._round = {"server/matched_classes": float(len(classes)), "server/crt_loss": crt_loss}
        if losses:
            self._round.update({"server/match_loss_first": losses[0], "server/match_loss_last": losses[-1]})

    def on_round_end(self, ctx, metrics: dict[str, Any]) -> None:
        metrics.update(self._round)
        self._round = {}

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["features"] = self.features.cpu()
        state["crt_head"] = {k: v.cpu() for k, v in self.crt_head.items()}
        return state

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        super().load_state_dict(state, device)
        self.features = state["features"].to(device)
        self.crt_head = {k: v.to(device) for k, v in state["crt_head"].items()}


register_method("creff", CReFFConfig, CReFFClient, CReFFServer)
