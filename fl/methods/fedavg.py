"""FedAvg (McMahan et al., 2017): local SGD on each client, server averages with weights n_i / N."""
from dataclasses import dataclass

from fl.config import MethodConfig
from fl.core import ClientModule, Server, register_method


@dataclass
class FedAvgConfig(MethodConfig):
    name: str = "fedavg"


class FedAvgClient(ClientModule):
    """Cross-entropy on the client's data; everything is shared (the base-class defaults)."""
    functional = True  # its loss is the base client_loss (cross-entropy): K clients can train at once


register_method("fedavg", FedAvgConfig, FedAvgClient, Server)
