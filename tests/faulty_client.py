"""A plug-in method (`plugins=[tests.faulty_client]`, `method.name=test_faulty_client`): FedAvg whose client 1 trains on
a NaN loss at round 1, the faulty client a robust aggregator leaves out (docs/aggregators.md, "Faulty clients")."""
from dataclasses import dataclass

from fl.config import MethodConfig
from fl.core import ClientModule, Server
from fl.core.registry import register_method


@dataclass
class FaultyConfig(MethodConfig):
    name: str = "test_faulty_client"


class FaultyClient(ClientModule):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if self.round == 1 and self.cid == 1 else loss


register_method("test_faulty_client", FaultyConfig, FaultyClient, Server)
