"""Server: a method's server step, registered as a Fabric callback. The default is FedAvg."""
from __future__ import annotations

from typing import Any, ClassVar, Optional

import torch
from omegaconf import DictConfig
from torch import Tensor

import fl.core.registry as registry
from fl.core.aggregation import Uploads
from fl.core.client import ClientModule, Upload
from fl.core.context import RoundContext
from fl.core.federated_data import FederatedData
from fl.core.metric_directions import Directions
from fl.core.plugin_calls import blamed


class Server:
    """Hooks the loop calls, in order, each round:

    select(round, sampled)              which of the sampled clients train (default: all of them)
    on_round_start(ctx, selected)       [fabric.call: every callback gets it]
    broadcast(cid)                      payload sent to a client before local training and evaluation
    weight(cid, upload)                 raw aggregation weight of an upload (default: n_i)
    aggregate(uploads)                  the round's new shared parameters from its uploads (fl/core/aggregation.py);
                                        default: `server.aggregator.name` (fl/aggregators/), the float64 weighted
                                        mean unless set
    server_step(ctx, mean, messages)    [fabric.call] mean = what `aggregate` returned (the weighted mean of the
                                        uploaded params over all clients of the round by default);
                                        messages = {cid: message}, in client order
    on_evaluate(ctx, metrics)           [fabric.call, evaluation rounds only, after the per-client accuracies
                                        and the evaluators] callbacks may add evaluation metrics
    on_round_end(ctx, metrics)          [fabric.call] callbacks may add diagnostics to `metrics`
    on_checkpoint(ctx, path)            [fabric.call, after a checkpoint of round ctx.round is written]

    `ctx` is a RoundContext: the round, Fabric (collectives), the data and the config.

    The weighted mean streams (memory does not grow with the round's clients); `aggregate` sees each client's upload
    (`uploads.clients`) only when `needs_every_upload` is true: the chosen aggregator needs them, or a method that
    overrides `aggregate` sets it.

    `metric_directions` names the keys the server adds to `metrics` and which way each is better
    (fl/core/metric_directions.py); declare them where they are logged.
    """

    metric_directions: ClassVar[Directions] = {}

    def __init__(self, cfg: DictConfig):
        self.cfg = cfg
        self.hp = cfg.method
        self.global_params: dict[str, Tensor] = {}
        self.aggregation = cfg.server.aggregator  # the aggregator's block: its name and settings
        registry.load_plugins()
        self.aggregator = registry.AGGREGATORS[self.aggregation.name]

    @property
    def needs_every_upload(self) -> bool:
        return not self.aggregator.streams

    @property
    def uses_chosen_aggregator(self) -> bool:
        """`server.aggregator.name` aggregates for this server (a method that overrides `aggregate` has its own)."""
        return type(self).aggregate is Server.aggregate

    @property
    def leaves_out_faulty_uploads(self) -> bool:
        """The chosen aggregator is a robust rule and aggregates for this server: a client's non-finite upload is
        left out of its round instead of stopping the run (a method with its own aggregation stops as ever)."""
        return self.aggregator.robust and self.uses_chosen_aggregator

    @classmethod
    def own_aggregation(cls, hp: DictConfig) -> Optional[str]:
        """Why `server.aggregator.name` cannot replace this method's aggregation (config validation refuses any but
        mean, with this reason); None: any aggregator may. A method that overrides `aggregate` has its own."""
        if cls.aggregate is not Server.aggregate:
            return "its server aggregates the uploads itself"
        return None

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

    def aggregate(self, uploads: Uploads) -> dict[str, Tensor]:
        """The chosen aggregator over the uploads, from the global model the clients received."""
        with blamed("server.aggregator.name", self.aggregation.name, self.aggregator.fn):
            return self.aggregator.fn(uploads, self.global_params, self.aggregation)

    def server_step(self, ctx: RoundContext, mean: dict[str, Tensor], messages: dict[int, dict]) -> None:
        if mean:
            self.global_params = mean

    def step_towards(self, mean: dict[str, Tensor], rate: float, keys: Optional[set] = None) -> dict[str, Tensor]:
        """A server step size: x + rate * (mean - x) in float64 for the floating tensors in `keys` (default:
        all); the others take the mean. rate = 1 is the mean itself."""
        if rate == 1.0:
            return dict(mean)
        new = {}
        for k, v in mean.items():
            x = self.global_params.get(k)
            if x is not None and v.is_floating_point() and (keys is None or k in keys):
                x64 = x.double()
                new[k] = (x64 + rate * (v.double() - x64)).to(x.dtype)
            else:
                new[k] = v
        return new

    def state_dict(self) -> dict[str, Any]:
        return {"global_params": {k: v.cpu() for k, v in self.global_params.items()}}

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        self.global_params = {k: v.to(device) for k, v in state["global_params"].items()}
