"""A method whose reported training loss grows 1e4-fold from round 2 on, gradients unchanged, so it stays finite
(`method.name=test_loss_grows_at_round_2`): imported by tests that run in-process, and as a script
(`python tests/diverge_at_round.py key=value ...`) for runs in processes of their own."""
import sys
from dataclasses import dataclass

from fl.config import MethodConfig
from fl.core import ClientModule, Server
from fl.core.registry import METHODS, register_method

GROWTH = 1e4


@dataclass
class GrowingLossConfig(MethodConfig):
    name: str = "test_loss_grows_at_round_2"


class GrowingLossClient(ClientModule):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss + (GROWTH - 1) * loss.detach() if self.round >= 2 else loss


if "test_loss_grows_at_round_2" not in METHODS:
    register_method("test_loss_grows_at_round_2", GrowingLossConfig, GrowingLossClient, Server)

if __name__ == "__main__":
    from fl.run.train import main

    sys.exit(main(sys.argv[1:]))
