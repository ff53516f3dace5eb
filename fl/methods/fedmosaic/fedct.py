"""FedCT (Abourayya et al., federated co-training), FedMosaic's baseline (Sec. 4, Tables 2-4): the same protocol
on the public set U without either FedMosaic mechanism. Clients send hard predictions on U; the server
takes the majority vote (ties to the lowest class); each client minimizes l_priv + l_pseudo (lambda = 1).

This is FedMosaic with method.lambda_mode=fixed, method.lambda_fixed=1 and method.confidence=uniform
(tested to give the same run). The original FedCT code instead mixes the pseudo-labelled U into the
training data; with equal batch sizes that is the same loss up to a factor 1/2.
"""
from dataclasses import dataclass

import torch
from torch import Tensor

from fl.core import register_method
from fl.methods.fedmosaic import CoTrainingClient, CoTrainingConfig, CoTrainingServer, resolve


@dataclass
class FedCTConfig(CoTrainingConfig):
    name: str = "fedct"


class FedCTClient(CoTrainingClient):
    def lambda_weight(self, l_priv: Tensor, l_pseudo: Tensor) -> Tensor:
        return torch.ones((), device=l_priv.device)

    def confidence(self, preds: Tensor, probs: Tensor) -> Tensor:
        return torch.ones(preds.shape[0])  # every vote counts the same: a majority vote


register_method("fedct", FedCTConfig, FedCTClient, CoTrainingServer, resolve, needs=("data.public_size=40",))
