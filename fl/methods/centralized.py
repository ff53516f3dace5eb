"""Centralized: one model trained on the pooled training data of all clients (the upper reference).

A round is `trainer.local_epochs` passes (or `local_steps` steps) over the pooled data; evaluation is
the same as for federated methods (each client's test split, and the pooled test set).
"""
from dataclasses import dataclass

from fl.config import MethodConfig
from fl.core import ClientModule, FederatedData, Server, Split, register_method


@dataclass
class CentralizedConfig(MethodConfig):
    name: str = "centralized"


class CentralizedClient(ClientModule):
    def train_split(self, data: FederatedData, cid: int) -> Split:
        if not hasattr(self, "_pooled"):
            self._pooled = data.pooled_train()
        return self._pooled


class CentralizedServer(Server):
    def select(self, round_idx: int, sampled: list[int]) -> list[int]:
        return [0]  # one training unit per round: the pooled data (seeded as client 0)


register_method("centralized", CentralizedConfig, CentralizedClient, CentralizedServer)
