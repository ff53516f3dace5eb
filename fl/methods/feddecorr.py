"""FedDecorr (Shi et al., ICLR 2023, "Towards Understanding and Mitigating Dimensional Collapse in Heterogeneous
Federated Learning"): local training penalises correlation between the dimensions of the representation, which
counters the dimensional collapse that label skew causes; aggregation is FedAvg's.

The client loss (the FedDecorr regulariser):

    L = CE + beta * L_FedDecorr,      L_FedDecorr = ||K||_F^2 / d^2

K the d x d correlation matrix of the batch's representations (the backbone's output, before the classifier):
each dimension z-scored over the batch, K = Z^T Z / N. Its diagonal is 1, so only the correlations between
dimensions move the loss.

- A dimension constant over the batch (a ReLU unit that is off for every sample) has no correlation; eps
  (1e-8, added to the variance) makes its row and column of K zero instead of 0/0.
- `method.form=official` is the loss of the authors' released code instead: the squared off-diagonal entries of
  Z^T Z (z-scored with the unbiased variance) averaged, then divided by N. Both see K only through
  R = sum_{i != j} K_ij^2 (eps aside): official = (N-1)^2 R / (N d (d-1)), paper = (d + R) / d^2. So their
  gradients are parallel, official's (N-1)^2 d / (N (d-1)) times the paper's (62.5 at N = 64, d = 128), while their
  values differ by (N-1)^2 d R / (N (d-1) (d + R)): near (N-1)^2 / N (62 at N = 64) only when R >> d (strongly
  correlated dimensions), about (N-1)^2 d / (N (N + d - 2)) for independent ones (31 at d = 64, 55 at d = 512).
beta = 0 gives FedAvg's training exactly: the term is computed (and logged as `decorr`) but adds nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor

from fl.config import MethodConfig, param
from fl.core import ClientModule, Server, float32_island, register_method
from fl.core.metric_directions import LOWER

EPS = 1e-8


@dataclass
class FedDecorrConfig(MethodConfig):
    name: str = "feddecorr"
    beta: float = param(0.1, ge=0.0, search={"values": [0.01, 0.05, 0.1, 0.3, 1.0]},
                        help="beta: weight of the decorrelation loss")
    form: str = param("paper", choices=["paper", "official"],
                      help="paper: ||K||_F^2 / d^2; official: the released code's off-diagonal mean of "
                      "Z^T Z / N (its gradient (N-1)^2 d / (N (d-1)) times the paper's: 62.5 at N = 64, d = 128)")


@float32_island
def decorr_loss(features: Tensor, form: str = "paper") -> Tensor:
    """The decorrelation penalty of a batch of representations [N, d] (see the module docstring), in float32 under
    mixed precision: autocast would run z^T z in half precision."""
    n, d = features.shape
    z = features - features.mean(dim=0, keepdim=True)
    if form == "paper":
        z = z / (z.pow(2).mean(dim=0, keepdim=True) + EPS).sqrt()  # z-scores: K is the correlation matrix
        corr = z.T @ z / n
        return corr.pow(2).sum() / d ** 2
    if n < 2 or d < 2:  # no unbiased variance, or no off-diagonal entry
        return features.sum() * 0.0
    z = z / (z.pow(2).sum(dim=0, keepdim=True) / (n - 1) + EPS).sqrt()
    gram = z.T @ z
    off = gram.pow(2).sum() - gram.diagonal().pow(2).sum()
    return off / (d * (d - 1)) / n


class FedDecorrClient(ClientModule):
    metric_directions = {"ce": LOWER, "decorr": LOWER}
    needs_backbone = True  # the penalty acts on the backbone's representation

    def training_step(self, batch, batch_idx):
        x, y = batch
        features = self.model.backbone(x)
        logits = self.model.head(features)
        ce = F.cross_entropy(logits, y)
        decorr = decorr_loss(features, self.hp.form)
        return {"loss": ce + self.hp.beta * decorr, "ce": ce.detach(), "decorr": decorr.detach()}


register_method("feddecorr", FedDecorrConfig, FedDecorrClient, Server)
