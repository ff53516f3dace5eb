"""FedAS (Yang, Huang and Ye, "FedAS: Bridging Inconsistency in Personalized Federated Learning", CVPR 2024):
a shared body and a personal head per client, with Federated Parameter-Alignment on the client and Federated
Client-Synchronization on the server.

    client i, round t, given the global body theta_s:
      parameter alignment   theta_s is trained (the body only) so that its features on D_i match what client i's
                            own previous local model produces on D_i:
                              L_align = mean over the batch and feature dimensions of (f(x; theta_s) - t(x))^2
                            t(x) = z_{y}, the class prototype of the previous local model's features (the authors'
                            code, `target=prototype`), or t(x) = f(x; theta_s^prev), that model's features of the
                            same sample (FedDRM's official FedAS baseline, `target=sample`)
      local training        cross-entropy on the whole model (aligned body and personal head)
      upload                the body and tr(F_i), the trace of the empirical Fisher information of the trained
                            local model on D_i
    server (client synchronization):
      theta_s <- sum_i alpha_i theta_s,i,  alpha_i = tr(F_i) / sum_j tr(F_j) over the round's clients
      (n_i-weighted averaging with `weighting=samples`, as FedDRM's official baseline aggregates)

tr(F_i) (`fisher`): with l = -log p(y | x; theta) over every trainable parameter of the client's model (body and
personal head, as the authors' code), in eval mode, after local training, on the client's training split:
    batch   sum over mini-batches B of || grad (1/|B|) sum_{j in B} l_j ||^2   (the authors' released code: full
            batches of the stored order; their loader drops the last partial one)
    sample  (1/n) sum_j || grad l_j ||^2                                      (the empirical Fisher's trace)

How it maps onto this framework:
- The personal head is `model.head` (private). The previous local model the alignment needs is the client's body at
  the end of its last local training, kept per client (`persistent = ("previous",)`: state store, checkpoints,
  resume). A client's first visit aligns to w^0, the seeded initial model, which both public codes start every
  client from.
- The first `align_steps` optimizer steps of a round are alignment steps (body only, an optimizer of their own built
  from `optim.*` at `align_lr`, default the round's lr); the remaining steps of `trainer.local_steps` (or
  local_epochs) are cross-entropy steps of the configured optimizer, which has not stepped before them, so its
  momentum starts fresh (FedDRM's code: local_steps // 5 alignment steps, then a new optimizer). align_steps = 0
  with `weighting=samples` and `eval_model=received` is FedPer exactly.
- `features`: head_input aligns the shared part's output, what the head sees (the authors' code: `model.base`);
  backbone aligns the features before `model.proj_dim`'s projection (FedDRM's code: the ResNet's 512-d output).
- `eval_model`: local scores the client's own last local model (trained body and head; the authors' code evaluates
  its clients' models); received scores the global body with the personal head (FedDRM's code).
- Fisher weights enter through `Server.weight(cid, upload)`, so the orchestrator's weighted mean is the paper's
  client synchronization; buffers (BatchNorm statistics) are averaged with the same weights.

The paper's full text was not available here: the formulas above follow the authors' released code (and FedDRM's for
`target=sample`); the paper's equation numbers, and whether its Fisher trace is per-sample or per-batch, are not
checked.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from fl.config import ConfigError, MethodConfig, param
from fl.core import HEAD, ClientModule, Server, TrainingFault, Upload, build_optimizer, register_method
from fl.core.label_sums import class_sums
from fl.core.metric_directions import LOWER, NEITHER


@dataclass
class FedASConfig(MethodConfig):
    name: str = "fedas"
    align_steps: int = param(2, ge=0, search={"values": [0, 1, 2, 3, 5]},
                             help="parameter alignment: optimizer steps at the start of each round's local steps "
                             "that train the received body to match the previous local model's features (0 = none)")
    align_lr: Optional[float] = param(None, gt=0.0, help="learning rate of the alignment steps; null = the round's lr")
    target: str = param("prototype", choices=["prototype", "sample"],
                        help="what the aligned features match: prototype = the previous local model's class means "
                        "(the authors' code), sample = its features of the same sample (FedDRM's code)")
    features: str = param("head_input", choices=["head_input", "backbone"],
                          help="where features are taken: head_input = the shared part's output (the head's input), "
                          "backbone = before model.proj_dim's projection (FedDRM's code)")
    weighting: str = param("fisher", choices=["fisher", "samples"],
                           help="client synchronization: fisher = alpha_i = tr(F_i) / sum_j tr(F_j); samples = n_i "
                           "(FedAvg's weights, FedDRM's code)")
    fisher: str = param("batch", choices=["batch", "sample"],
                        help="tr(F_i) estimator: batch = sum over mini-batches of ||grad of the batch-mean NLL||^2 "
                        "(the authors' code), sample = mean over samples of ||grad NLL||^2")
    eval_model: str = param("local", choices=["local", "received"],
                            help="the personalized model scored: local = the client's last local model (the authors' "
                            "code), received = the global body with the personal head (FedDRM's code)")


def class_prototypes(features: Tensor, y: Tensor, num_classes: int) -> Tensor:
    """z_c = the mean of `features` over the samples of class c ([num_classes, d]; zero rows for absent classes)."""
    sums = class_sums(features, y, num_classes).to(features.dtype)  # deterministic on CUDA, where index_add_ is not
    counts = torch.bincount(y, minlength=num_classes).to(features.dtype)
    return sums / counts.clamp_min(1)[:, None]


def alignment_loss(features: Tensor, y: Tensor, previous: Optional[Tensor] = None,
                   prototypes: Optional[Tensor] = None) -> Tensor:
    """L_align: the mean over the batch and the feature dimensions of (f(x) - t(x))^2, with t(x) the previous local
    model's prototype of x's class (`prototypes`) or its features of x (`previous`)."""
    target = prototypes[y] if prototypes is not None else previous
    return F.mse_loss(features, target.detach().to(features.dtype))


class FedASClient(ClientModule):
    metric_directions = {"ce": LOWER, "align_mse": LOWER}
    has_global_model = False  # the shared body has no head of its own
    needs_backbone = True  # the alignment trains the body on its features
    persistent = ("previous",)  # the body of the client's last local model (the alignment's reference)

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        self.automatic_optimization = False  # alignment and cross-entropy steps step different optimizers
        self.previous: dict[str, Tensor] = {k: v.detach().clone() for k, v in self.model.backbone.state_dict().items()}
        self._align_opt = None
        self._prototypes: Optional[Tensor] = None
        self._align_mse0: Optional[Tensor] = None

    def is_private(self, key: str) -> bool:
        return key.startswith(HEAD)

    # ---- features ---------------------------------------------------------------------------------------------
    def _feature_net(self) -> tuple[nn.Module, str]:
        """The network whose output is aligned, and its key prefix inside `model.backbone`."""
        backbone = self.model.backbone
        if self.hp.features == "head_input" or not hasattr(self.model, "without_projection"):
            return backbone, ""
        body = self.model.without_projection()[0]
        name = next(n for n, m in backbone.named_modules() if m is body)
        return body, f"{name}." if name else ""

    def _previous_features(self, x: Tensor) -> Tensor:
        """Features of the client's previous local model (its stored body; buffers included), in the net's mode."""
        net, prefix = self._feature_net()
        state = {k[len(prefix):]: v for k, v in self.previous.items() if k.startswith(prefix)}
        return functional_call(net, state, (x,))

    def _after_features(self, f: Tensor) -> Tensor:
        """Logits from the aligned features (the projection, if they come before it, then the head)."""
        net, _ = self._feature_net()
        if net is not self.model.backbone:
            f = self.model.backbone.proj(f)
        return self.model.head(f)

    # ---- local training ---------------------------------------------------------------------------------------
    def on_local_train_start(self) -> None:
        self._align_mse0, self._prototypes, self._align_opt = None, None, None
        if self.hp.align_steps == 0:
            return
        shared = [p for k, p in self.named_parameters() if not self.is_private(k)]
        lr = self.lr if self.hp.align_lr is None else float(self.hp.align_lr)
        self._align_opt = self.fabric.setup_optimizers(build_optimizer(self.cfg, shared, lr))
        if self.hp.target == "prototype":  # z_c from the previous local model over the client's training split
            train = self.train_split(self.data, self.cid)
            feats, labels = zip(*self.eval_pass(train, self._previous_features))
            self._prototypes = class_prototypes(torch.cat(feats).float(), torch.cat(labels), self.num_classes)

    def training_step(self, batch, batch_idx):
        x, y = batch
        if batch_idx < self.hp.align_steps:  # parameter alignment: the body only
            net, _ = self._feature_net()
            f = net(x)
            if self.hp.target == "sample":
                was = net.training
                net.eval()  # the previous model is a frozen reference (FedDRM's code: prev_model.eval())
                with torch.no_grad():
                    previous = self._previous_features(x)
                net.train(was)
                loss = alignment_loss(f, y, previous=previous)
            else:
                loss = alignment_loss(f, y, prototypes=self._prototypes)
            opt = self._align_opt
            opt.zero_grad(set_to_none=True)
            self.manual_backward(loss)
            opt.step()
            with torch.no_grad():
                ce = F.cross_entropy(self._after_features(f.detach()), y)
            if self._align_mse0 is None:
                self._align_mse0 = loss.detach()
        else:  # local training: cross-entropy of the whole model
            opt = self.optimizers()
            loss = F.cross_entropy(self(x), y)
            opt.zero_grad(set_to_none=True)
            self.manual_backward(loss)
            opt.step()
            ce = loss
        logs = {"loss": loss.detach(), "ce": ce.detach()}
        if self._align_mse0 is not None:  # the received body's gap to the previous local model, before alignment
            logs["align_mse"] = self._align_mse0
        return logs

    def on_local_train_end(self) -> None:
        self.previous = {k: v.detach().clone() for k, v in self.model.backbone.state_dict().items()}
        self._align_opt, self._prototypes = None, None

    # ---- client synchronization: tr(F_i) ------------------------------------------------------------------------
    def fisher_trace(self) -> float:
        """tr(F_i) of the client's model on its training split (eval mode, no augmentation, batches of
        trainer.batch_size in stored order), over every trainable parameter, in float64. `batch` sums over the full
        batches only, as the authors' loader does (drop_last=True, unshuffled): a client with fewer than
        batch_size samples has tr(F_i) = 0. `sample` averages over every sample."""
        train = self.train_split(self.data, self.cid)
        named = {k: p for k, p in self.model.named_parameters() if p.requires_grad}
        bs = self.cfg.trainer.batch_size
        end = len(train) // bs * bs if self.hp.fisher == "batch" else len(train)
        total = torch.zeros((), dtype=torch.float64)
        was = self.training
        self.eval()
        try:
            with torch.enable_grad():
                for begin in range(0, end, bs):
                    x, y = self.make_batch(train, slice(begin, min(begin + bs, end)))
                    if self.hp.fisher == "batch":
                        grads = torch.autograd.grad(F.cross_entropy(self.model(x), y), list(named.values()),
                                                    allow_unused=True)
                        sq = sum(g.double().pow(2).sum() for g in grads if g is not None)
                    else:
                        sq = per_sample_sq_grad_norms(self.model, named, x, y).sum()
                    total += sq.detach().cpu()
        finally:
            self.train(was)
        return float(total) / (len(train) if self.hp.fisher == "sample" else 1)

    def upload(self) -> Upload:
        up = super().upload()
        if self.hp.weighting == "fisher":
            up.message = {"fisher": self.fisher_trace()}
        return up

    # ---- evaluation -------------------------------------------------------------------------------------------
    def predict(self, x: Tensor) -> Tensor:
        if self.hp.eval_model == "local" and self.cid >= 0:  # the client's last local model: its own body and head
            return self.model.head(functional_call(self.model.backbone, self.previous, (x,)))
        return self(x)


def per_sample_sq_grad_norms(model: nn.Module, named: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
    """||grad_theta -log p(y_j | x_j)||^2 for each sample j (float64), theta = `named`."""
    params = {k: p.detach() for k, p in named.items()}

    def nll(p, xj, yj):
        return F.cross_entropy(functional_call(model, p, (xj.unsqueeze(0),)), yj.unsqueeze(0))

    grads = vmap(grad(nll), in_dims=(None, 0, 0))(params, x, y)
    return sum(g.double().pow(2).flatten(1).sum(1) for g in grads.values())


class FedASServer(Server):
    """Client synchronization: the mean the server receives is weighted by `weight` (tr(F_i), or n_i)."""
    metric_directions = {"server/fisher_min": NEITHER, "server/fisher_max": NEITHER, "server/alpha_max": NEITHER}

    def __init__(self, cfg):
        super().__init__(cfg)
        self._round: dict[str, float] = {}

    def weight(self, cid: int, upload: Upload) -> float:
        return float(upload.message["fisher"]) if self.hp.weighting == "fisher" else upload.weight

    @classmethod
    def own_aggregation(cls, hp) -> Optional[str]:
        return "its aggregation weights are the clients' tr(F_i) (method.weighting=fisher)" if (
            hp.weighting == "fisher") else None

    def server_step(self, ctx, mean: dict[str, Tensor], messages: dict[int, dict]) -> None:
        traces = [float(m["fisher"]) for m in messages.values() if m and "fisher" in m]
        if traces and sum(traces) <= 0:  # alpha_i = 0 / 0: no client of the round had a full batch
            raise TrainingFault(f"method fedas, round {ctx.round}: every client's tr(F_i) is 0 (tr(F_i) sums over "
                                f"full batches of trainer.batch_size={self.cfg.trainer.batch_size}), so the Fisher "
                                "weights are undefined; use a smaller trainer.batch_size or method.weighting=samples")
        if not mean:
            return
        # theta_s <- sum_i alpha_i theta_s,i: `mean` is already weighted by alpha_i = tr(F_i) / sum_j tr(F_j)
        self.global_params = mean
        if traces:
            total = sum(traces)
            self._round = {"server/fisher_min": min(traces), "server/fisher_max": max(traces),
                           "server/alpha_max": max(traces) / total if total > 0 else float("nan")}

    def on_round_end(self, ctx, metrics: dict[str, Any]) -> None:
        metrics.update(self._round)
        self._round = {}


def resolve(cfg) -> None:
    steps = cfg.trainer.local_steps
    if steps is not None and cfg.method.align_steps >= steps:
        raise ConfigError(f"method.align_steps={cfg.method.align_steps} must be < trainer.local_steps={steps}, "
                          "or the model never trains on its loss")


register_method("fedas", FedASConfig, FedASClient, FedASServer, resolve=resolve)
