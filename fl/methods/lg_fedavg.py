"""LG-FedAvg (Liang et al., 2020, "Think Locally, Act Globally"): local representations, a global head.

Each client keeps its representation layers (the body) to itself and learns them only on its own data; the
top layers, here the classifier head, are the global model: uploaded and averaged as in FedAvg (weights
n_i), then sent back to every client. This is the mirror image of FedPer (private head, shared body).
Every client's body starts from the same seeded initialisation; there is no global model to evaluate on
the pooled test set (the averaged head has no body of its own).
"""
from dataclasses import dataclass

from fl.config import MethodConfig
from fl.core import HEAD, ClientModule, Server, register_method


@dataclass
class LGFedAvgConfig(MethodConfig):
    name: str = "lg_fedavg"


class LGFedAvgClient(ClientModule):
    has_global_model = False  # the global head has no body of its own
    functional = True  # cross-entropy: the base client_loss, for one client or K at once

    def is_private(self, key: str) -> bool:
        return not key.startswith(HEAD)  # the local representation layers


register_method("lg_fedavg", LGFedAvgConfig, LGFedAvgClient, Server)
