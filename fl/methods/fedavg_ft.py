"""FedAvg-FT: FedAvg, then each client fine-tunes the global model on its own data before evaluation.

The fine-tuned copy is used only for that client's evaluation; it is never sent nor kept.
"""
from dataclasses import dataclass

from fl.config import MethodConfig, param
from fl.core import ClientModule, Server, register_method


@dataclass
class FedAvgFTConfig(MethodConfig):
    name: str = "fedavg_ft"
    finetune_epochs: int = param(1, ge=0, search={"values": [1, 2, 5]}, help="local epochs before evaluation")


class FedAvgFTClient(ClientModule):
    def personalize(self) -> None:
        if self.hp.finetune_epochs > 0:
            optimizer = self.fabric.setup_optimizers(self.configure_optimizers())
            self.fit_local(optimizer, epochs=self.hp.finetune_epochs, purpose="finetune")


register_method("fedavg_ft", FedAvgFTConfig, FedAvgFTClient, Server)
