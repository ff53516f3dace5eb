"""A method whose loss turns NaN at round 2 (`method.name=test_nan_at_round_2`): imported by tests that run in-process,
and as a script (`python tests/nan_at_round.py key=value ...`) for runs in processes of their own (ddp)."""
import sys
from dataclasses import dataclass

from fl.config import MethodConfig
from fl.core import ClientModule, Server
from fl.core.registry import register_method


@dataclass
class NanConfig(MethodConfig):
    name: str = "test_nan_at_round_2"


class NanClient(ClientModule):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if self.round == 2 else loss


register_method("test_nan_at_round_2", NanConfig, NanClient, Server)

if __name__ == "__main__":  # a process of its own ends as the command line's does (fl/train.py)
    from fl.run.process_exit import end_process
    from fl.run.train import main

    end_process(main(sys.argv[1:]))
