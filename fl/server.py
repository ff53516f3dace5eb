"""Server: a method's server step, registered as a Fabric callback. The default is FedAvg."""
from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig
from torch import Tensor

from fl.client import ClientModule, Upload
from fl.data import FederatedData


class Server:
    """Hooks the orchestrator calls, in order, each round:

    select(round, sampled)            which of the sampled clients train (default: all of them)
    on_round_start(orch, round, selected)   [fabric.call: every callback gets it]
    broadcast(cid)                    payload sent to a client before local training and evaluation
    weight(cid, upload)               raw aggregation weight of an upload (default: n_i)
    server_step(orch, round, mean, messages)   [fabric.call] mean = weighted mean of the uploaded
                                      params over all clients of the round; messages = {cid: message}
    on_evaluate(orch, round, metrics)   [fabric.call, evaluation rounds only, after the per-client
                                      accuracies and the evaluators] callbacks may add eval metrics
    on_round_end(orch, round, metrics)  [fabric.call] callbacks may add diagnostics to `metrics`
    """

    #: whether `broadcast(-1)` defines a global model worth evaluating on the pooled test set
    has_global_model: bool = True

    def __init__(self, cfg: DictConfig):
        self.cfg = cfg
        self.hp = cfg.method
        self.global_params: dict[str, Tensor] = {}

    def setup(self, module: ClientModule, data: FederatedData) -> None:
        """The initial global model is the module's shared state after seeded initialisation."""
        self.data = data
        self.global_params = {k: v.detach().clone() for k, v in module.shared_state().items()}

    def select(self, round_idx: int, sampled: list[int]) -> list[int]:
        return sampled

    def broadcast(self, cid: int) -> dict[str, Any]:
        return {"params": self.global_params}

    def weight(self, cid: int, upload: Upload) -> float:
        return upload.weight

    def server_step(self, orch, round_idx: int, mean: dict[str, Tensor], messages: dict[int, dict]) -> None:
        if mean:
            self.global_params = mean

    def state_dict(self) -> dict[str, Any]:
        return {"global_params": {k: v.cpu() for k, v in self.global_params.items()}}

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        self.global_params = {k: v.to(device) for k, v in state["global_params"].items()}
