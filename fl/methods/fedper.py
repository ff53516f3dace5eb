"""FedPer (Arivazhagan et al., 2019): FedAvg on the base layers; the classifier head stays on each client."""
from dataclasses import dataclass

from fl.client import ClientModule
from fl.config import MethodConfig
from fl.registry import register_method
from fl.server import Server


@dataclass
class FedPerConfig(MethodConfig):
    name: str = "fedper"


class FedPerClient(ClientModule):
    def is_private(self, key: str) -> bool:
        return key.startswith("model.head.")


class FedPerServer(Server):
    has_global_model = False  # the shared backbone has no head of its own


register_method("fedper", FedPerConfig, FedPerClient, FedPerServer)
