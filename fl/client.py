"""ClientModule: the LightningModule a method subclasses. Its `training_step` holds the paper's client loss.

One instance lives on each process for the whole run; the orchestrator swaps each client's state in and
out of it. A round for client i is:

    module.receive(server.broadcast(i))      # what the server sends
    module.load_client_state(store[i])       # what stayed on the client (None on its first visit)
    on_local_train_start / training_step ... / on_local_epoch_end / on_local_train_end
    module.upload()                          # what goes back: parameters to average, a weight, a message
    store[i] = module.client_state()         # what stays private, moved off the accelerator
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import lightning as L
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import Tensor

from fl.data import FederatedData, Split
from fl.models import build_model


@dataclass
class Upload:
    """What one client sends back after local training.

    params:  tensors the server averages over clients, weighted by `Server.weight(cid, upload)`
             (the orchestrator reduces them across processes with a float64 all-reduce)
    weight:  the client's raw aggregation weight; FedAvg uses its number of training samples n_i
    message: anything else the server needs (statistics, predictions on a public set, scores);
             gathered from every process, in client order, before the server step
    """
    params: dict[str, Tensor] = field(default_factory=dict)
    weight: float = 1.0
    message: dict[str, Any] = field(default_factory=dict)


def round_lr(cfg: DictConfig, round_idx: int) -> float:
    """The learning rate of a round under `optim.round_schedule` (stepped once per round, not per step)."""
    o = cfg.optim
    if o.round_schedule == "constant" or round_idx < 0:
        return float(o.lr)
    progress = round_idx / max(cfg.trainer.rounds, 1)
    return float(o.min_lr + (o.lr - o.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def build_optimizer(cfg: DictConfig, params, lr: Optional[float] = None) -> torch.optim.Optimizer:
    """The configured optimizer over the trainable `params`; `lr` overrides optim.lr (round schedules)."""
    o = cfg.optim
    lr = float(o.lr) if lr is None else lr
    params = [p for p in params if p.requires_grad]
    if o.name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=o.momentum, weight_decay=o.weight_decay)
    if o.name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=o.weight_decay)
    return torch.optim.AdamW(params, lr=lr, weight_decay=o.weight_decay)


class ClientModule(L.LightningModule):
    #: keep each client's optimizer state (e.g. momentum) in the state store across rounds
    keep_optimizer_state: bool = False

    def __init__(self, cfg: DictConfig, data: FederatedData):
        super().__init__()
        self.cfg = cfg
        self.hp = cfg.method  # the method's typed hyperparameters, under the paper's names
        self.num_classes = data.num_classes
        self.model = build_model(cfg, data.input_shape, data.num_classes)
        self.cid = -1  # the client whose state is loaded; -1 = the global model
        self.round = -1
        self.num_train = 0
        self._initial_private: dict[str, Tensor] = {}
        self.data: Optional[FederatedData] = None  # the run's data on the device, set by attach()
        self._batch_fn = None

    def attach(self, data: FederatedData, batch_fn) -> None:
        """Called once by the orchestrator: the run's data (on the training device) and its batch builder."""
        self.data, self._batch_fn = data, batch_fn

    def make_batch(self, split: Split, idx) -> tuple[Tensor, Tensor]:
        """(x, y) of `split[idx]`, normalised and on the device, as training batches are (no augmentation);
        e.g. a public set's batches (FedMosaic) or a pass over the local data for statistics (pFedFDA)."""
        return self._batch_fn(split, idx)

    @property
    def lr(self) -> float:
        """This round's learning rate (`optim.round_schedule`)."""
        return round_lr(self.cfg, self.round)

    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)

    # ---- what stays private -------------------------------------------------------------------
    def is_private(self, key: str) -> bool:
        """True for state_dict entries that never leave the client (e.g. a personal head)."""
        return False

    def shared_state(self) -> dict[str, Tensor]:
        return {k: v for k, v in self.state_dict().items() if not self.is_private(k)}

    def private_state(self) -> dict[str, Tensor]:
        return {k: v for k, v in self.state_dict().items() if self.is_private(k)}

    def snapshot_initial_state(self) -> None:
        """Called once after initialisation: a client's private part starts from these values."""
        self._initial_private = {k: v.detach().cpu().clone() for k, v in self.private_state().items()}

    # ---- communication ------------------------------------------------------------------------
    def receive(self, payload: dict[str, Any]) -> None:
        """Load what the server broadcast; by default its (shared) parameters."""
        params = payload.get("params")
        if params:
            self.load_state_dict(params, strict=False)

    def upload(self) -> Upload:
        """What this client sends back; by default every shared tensor, weighted by n_i."""
        return Upload(params={k: v.detach() for k, v in self.shared_state().items()}, weight=float(self.num_train))

    # ---- persistent client state ----------------------------------------------------------------
    def client_state(self) -> dict[str, Any]:
        """What this client keeps between rounds (CPU tensors). Extend the dict in subclasses."""
        return {"private": {k: v.detach().cpu().clone() for k, v in self.private_state().items()}}

    def load_client_state(self, state: Optional[dict[str, Any]]) -> None:
        private = state["private"] if state is not None else self._initial_private
        if private:
            self.load_state_dict(private, strict=False)

    # ---- local training -----------------------------------------------------------------------
    def train_split(self, data: FederatedData, cid: int) -> Split:
        return data.clients[cid].train

    def configure_optimizers(self):
        return build_optimizer(self.cfg, self.parameters(), self.lr)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int):
        """Return the loss, or a dict with 'loss' and other scalars to log as client/<i>/<name>."""
        x, y = batch
        return F.cross_entropy(self(x), y)

    def on_local_train_start(self) -> None:
        pass

    def on_local_epoch_end(self, epoch: int) -> None:
        pass

    def on_local_train_end(self) -> None:
        pass

    # ---- evaluation ---------------------------------------------------------------------------
    def personalize(self, orch, cid: int) -> None:
        """Runs before this client's evaluation (e.g. fine-tuning); its changes are not kept."""

    def predict(self, x: Tensor) -> Tensor:
        """Logits of the client's model (the global model when cid == -1)."""
        return self(x)

    def route_scores(self, x: Tensor) -> Optional[Tensor]:
        """A router's scores [B, num_clients]: a query goes to the argmax client, whose model then predicts
        (fl/metrics/system.py). Computed from the server's model (cid == -1). None (the default) = no
        router; system accuracy is then the majority vote of all client models."""
        return None
