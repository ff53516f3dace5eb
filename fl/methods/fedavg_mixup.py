"""FedAvg with input mixup (FedACD's Table 5, Zhou et al. 2025: "FedAvg w/"): FedAvg whose clients mix every local
minibatch as FedACD's do (Sec. 3.3; fl/methods/mixup.py), with the same alpha, and train on

    mu CE(f(x_mix), y) + (1 - mu) CE(f(x_mix), y[perm]),   x_mix = mu x + (1 - mu) x[perm],  mu ~ Beta(alpha, alpha);

the server averages as FedAvg does. It is the baseline that holds FedACD's mixup and nothing else of FedACD: the
unstated alpha is chosen on it (sweeps/fedavg_mixup_alpha_synthetic.yaml, for conf/fedacd_*_synthetic.yaml), never
on FedACD.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

from fl.config import MethodConfig, param
from fl.core import ClientModule, Server, register_method
from fl.methods.mixup import InputMixup


@dataclass
class FedAvgMixupConfig(MethodConfig):
    name: str = "fedavg_mixup"
    alpha: float = param(1.0, gt=0.0, search={"values": [0.2, 0.5, 1.0, 2.0]},
                         help="mixup: mu ~ Beta(alpha, alpha), one mu per batch (FedACD's method.alpha)")


class FedAvgMixupClient(ClientModule):
    def on_local_train_start(self) -> None:
        self._mixup = InputMixup(self.hp.alpha, int(self.cfg.seed), self.round, self.cid, "fedavg_mixup")

    def training_step(self, batch, batch_idx):
        x, y = batch
        x, y_b, mu = self._mixup(x, y)
        logits = self(x).float()  # the loss in fp32 under mixed precision
        return mu * F.cross_entropy(logits, y) + (1.0 - mu) * F.cross_entropy(logits, y_b)


register_method("fedavg_mixup", FedAvgMixupConfig, FedAvgMixupClient, Server)
