"""FedPer (Arivazhagan et al., 2019): FedAvg on the base layers; the classifier head stays on each client."""
from dataclasses import dataclass

from fl.config import MethodConfig
from fl.core import HEAD, ClientModule, Server, register_method


@dataclass
class FedPerConfig(MethodConfig):
    name: str = "fedper"


class FedPerClient(ClientModule):
    has_global_model = False  # the shared backbone has no head of its own
    functional = True  # cross-entropy: the base client_loss, for one client or K at once

    def is_private(self, key: str) -> bool:
        return key.startswith(HEAD)


register_method("fedper", FedPerConfig, FedPerClient, Server)
