"""FedAvg-FT: FedAvg, then each client fine-tunes the global model on its own data before evaluation.

The fine-tuned copy is used only for that client's evaluation; it is never sent nor kept. Its learning rate
is `finetune.lr` when set (else the round's rate, which a cosine schedule has brought near 0 by the last
rounds). The other FT protocol, FedAvg for R rounds and then local-only rounds (FedDRM's FT baselines), is
`method.name=fedavg finetune.after_round=R`, open to every method.
"""
from dataclasses import dataclass

from fl.config import ConfigError, MethodConfig, param
from fl.core import ClientModule, Server, build_optimizer, finetune_lr, register_method


@dataclass
class FedAvgFTConfig(MethodConfig):
    name: str = "fedavg_ft"
    finetune_epochs: int = param(1, ge=0, search={"values": [1, 2, 5]}, help="local epochs before evaluation")


def _resolve(cfg) -> None:
    if cfg.finetune.after_round is not None and cfg.method.finetune_epochs > 0:
        raise ConfigError("method.name=fedavg_ft fine-tunes before each evaluation; with finetune.after_round use "
                          "method.name=fedavg (local fine-tuning rounds after round R) or method.finetune_epochs=0")


class FedAvgFTClient(ClientModule):
    finetunes_for_evaluation = True
    reuse_personalized = True  # fine-tuning changes the parameters only

    def personalize(self) -> None:
        if self.hp.finetune_epochs > 0:
            optimizer = self.fabric.setup_optimizers(build_optimizer(self.cfg, self.parameters(),
                                                                     finetune_lr(self.cfg, self.round)))
            self.fit_local(optimizer, epochs=self.hp.finetune_epochs, purpose="finetune")


register_method("fedavg_ft", FedAvgFTConfig, FedAvgFTClient, Server, resolve=_resolve)
