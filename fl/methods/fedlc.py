"""FedLC (Zhang et al., ICML 2022, "Federated Learning with Label Distribution Skew via Logits Calibration"):
each client trains on cross-entropy over calibrated logits, which subtract a margin that grows as a class
gets rarer on that client; aggregation is FedAvg's.

The calibrated loss L_Cal of client c, with n_{c,y} the client's training samples of class y:

    L_Cal(x, y) = -log  exp(f_y(x) - tau n_{c,y}^{-1/4}) / sum_{y'} exp(f_{y'}(x) - tau n_{c,y'}^{-1/4})

i.e. cross-entropy on the logits shifted by -tau n_{c,y}^{-1/4}: a pairwise label margin
tau (n_{c,y}^{-1/4} - n_{c,y'}^{-1/4}) between the true class y and each other class y'. The calibration only
enters local training: predictions use the raw logits. With the same count for every class the shift is one
constant for all logits, and the loss is plain cross-entropy (FedAvg).

A class the client lacks (n_{c,y} = 0) has an infinite margin: its calibrated logit is -inf, so it drops out
of the softmax and its logit gets no gradient from this client.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from fl.config import MethodConfig, param
from fl.core import ClientModule, Server, register_method
from fl.core.metric_directions import LOWER


@dataclass
class FedLCConfig(MethodConfig):
    name: str = "fedlc"
    tau: float = param(1.0, gt=0.0, search={"values": [0.01, 0.1, 0.5, 1.0, 2.0]},
                       help="tau: the calibration strength, margin tau * n_{c,y}^(-1/4)")


def calibrated_logits(logits: Tensor, counts: Tensor, tau: float) -> Tensor:
    """f_y(x) - tau n_y^{-1/4} for every class y; -inf where n_y = 0."""
    present = counts > 0
    shift = torch.where(present, tau * counts.clamp(min=1).to(logits.dtype).pow(-0.25),
                        torch.zeros((), dtype=logits.dtype, device=logits.device))
    return (logits - shift).masked_fill(~present, float("-inf"))


def calibrated_loss(logits: Tensor, y: Tensor, counts: Tensor, tau: float) -> Tensor:
    """L_Cal averaged over the batch."""
    return F.cross_entropy(calibrated_logits(logits, counts, tau), y)


class FedLCClient(ClientModule):
    metric_directions = {"ce": LOWER}  # the uncalibrated cross-entropy

    def on_local_train_start(self) -> None:
        train = self.train_split(self.data, self.cid)
        device = next(self.parameters()).device
        self.counts = torch.bincount(train.y, minlength=self.num_classes).to(device)  # n_{c,y}

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x).float()  # the loss in fp32 under mixed precision
        loss = calibrated_loss(logits, y, self.counts, self.hp.tau)
        return {"loss": loss, "ce": F.cross_entropy(logits.detach(), y)}  # ce: uncalibrated, a diagnostic


register_method("fedlc", FedLCConfig, FedLCClient, Server)
