"""FedRoD (Chen & Chao, ICLR 2022): a shared feature extractor with two heads, a generic head (G-head)
trained with the balanced softmax loss and a personal head (P-head) that stays on the client.

Client i with training label counts n_{i,c} and features z = f(x):

    generic logits   g = G(z)
    L_BSM            = -log( n_{i,y} e^{g_y} / sum_c n_{i,c} e^{g_c} ) = CE(g + log n_i, y)
                       (classes absent from the client drop out of the normaliser: log 0 = -inf)
    personal logits  g + P(z)
    L_P              = CE(sg[g] + P(sg[z]), y)        (sg = stop-gradient)

The extractor and the G-head learn from L_BSM only, the P-head from L_P only; one optimizer over both
losses takes exactly the two separate updates (SGD/Adam act per parameter). The extractor and the G-head
are averaged as in FedAvg (weights n_i); the P-head is private. The generic model (extractor + G-head) is the
global model (`test/acc_global_micro`); each client is evaluated with its personal logits g + P(z).
The P-head is a linear layer on the feature dimension, drawn once at the seeded initialisation, so every
client's P-head starts from the same values.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fl.config import MethodConfig
from fl.core import ClientModule, Server, float32_island, register_method
from fl.core.metric_directions import LOWER


@dataclass
class FedRoDConfig(MethodConfig):
    name: str = "fedrod"


@float32_island
def balanced_softmax_loss(logits: Tensor, y: Tensor, counts: Tensor) -> Tensor:
    """Balanced softmax (Ren et al., 2020): cross-entropy of logits shifted by the log class counts, in float32
    under mixed precision (a count past 65504 is inf in float16, and bfloat16 rounds counts past 256)."""
    return F.cross_entropy(logits + torch.log(counts.to(logits.dtype)), y)


class FedRoDClient(ClientModule):
    metric_directions = {"bsm": LOWER, "personal": LOWER}

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        self.phead = nn.Linear(self.model.feature_dim, data.num_classes)
        self.counts: Tensor = torch.ones(data.num_classes)

    def is_private(self, key: str) -> bool:
        return key.startswith("phead.")

    def on_local_train_start(self) -> None:
        y = self.train_split(self.data, self.cid).y
        self.counts = torch.bincount(y, minlength=self.num_classes).to(self.device)

    def training_step(self, batch, batch_idx):
        x, y = batch
        z = self.model.backbone(x)
        g = self.model.head(z)
        bsm = balanced_softmax_loss(g, y, self.counts)
        personal = F.cross_entropy(g.detach() + self.phead(z.detach()), y)
        return {"loss": bsm + personal, "bsm": bsm.detach(), "personal": personal.detach()}

    def predict(self, x: Tensor) -> Tensor:
        z = self.model.backbone(x)
        g = self.model.head(z)
        return g if self.cid < 0 else g + self.phead(z)


register_method("fedrod", FedRoDConfig, FedRoDClient, Server)
