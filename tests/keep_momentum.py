"""A test method, `test_keep_momentum`: FedAvg whose clients keep their optimizer state (momentum) between rounds
and log their step index. One module, imported by every test file that runs it (a method registers once)."""
from dataclasses import dataclass

from fl.config import MethodConfig
from fl.core import ClientModule, Server
from fl.core.registry import register_method


@dataclass
class MomentumConfig(MethodConfig):
    name: str = "test_keep_momentum"


class MomentumClient(ClientModule):
    keep_optimizer_state = True

    def training_step(self, batch, batch_idx):
        return {"loss": super().training_step(batch, batch_idx), "step": float(batch_idx)}


register_method("test_keep_momentum", MomentumConfig, MomentumClient, Server)
