"""FedDRM (Wang et al., "Beyond Aggregation: Guiding Clients in Heterogeneous Federated Learning", 2025):
a shared backbone with two heads, trained on the negative profile empirical likelihood of a density ratio
model, which is two cross-entropies (FedDRM, Sec. 2.3, Thm. 2.2 and Eq. 7):

    client i:  lam * CE(target head_i(g(x)), y) + (1 - lam) * CE(client head(h(x)), i)  (Sec. 2.4; Alg. 1, line 9)
    server:    n_i-weighted average of everything except the private target head         (Algorithm 1, line 17)
    inference: a query goes to the client with the highest client score, whose model predicts
               (Remark 2.4, Sec. 3.2)

Network (Fig. 2 and Sec. 3.1; LayerNorm and ReLU as in the official code): f = backbone(x); target branch
g = ReLU(LN(Linear(f))) -> `head` (private: the client-specific target head (alpha_i, beta_i)); client branch
h = ReLU(LN(Linear(f))) -> `client_head` (gamma, xi), shared by all clients, m outputs. The two projections
are parallel on f and shared; their width is `model.proj_dim` (the paper's 512 -> 256 in the FedDRM configs,
whose baselines get the target branch alone through the same key; 0 = both heads on f).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fl.config import MethodConfig, param
from fl.core import HEAD, ClientModule, Server, float32_island, register_method
from fl.core.metric_directions import LOWER

ROUTING_RULES = ("posterior", "density_ratio")


@dataclass
class FedDRMConfig(MethodConfig):
    name: str = "feddrm"
    lam: float = param(0.8, ge=0.0, le=1.0, search={"values": [0.5, 0.6, 0.7, 0.8, 0.9, 0.95]},
                       help="lambda: weight of the target CE, (1 - lambda) of the client-id CE; the paper needs "
                       "> 0.5, its Fig. 4 peaks at 0.8 (the official config ships 0.9)")
    routing: str = param("posterior", choices=list(ROUTING_RULES),
                         help="posterior: argmax of the client logits (paper text); density_ratio: argmax of "
                         "logits - log(n_i/N), the prior-free density ratio (official camera-ready code)")


def projection(d: int, p: int) -> nn.Module:
    return nn.Identity() if p == 0 else nn.Sequential(nn.Linear(d, p), nn.LayerNorm(p), nn.ReLU())


class FedDRMNet(nn.Module):
    """backbone -> (target_proj -> head [private], client_proj -> client_head [shared])."""

    def __init__(self, backbone: nn.Module, feature_dim: int, num_classes: int, num_clients: int, proj_dim: int):
        super().__init__()
        p = proj_dim or feature_dim
        self.backbone = backbone
        self.target_proj = projection(feature_dim, proj_dim)
        self.head = nn.Linear(p, num_classes)
        self.client_proj = projection(feature_dim, proj_dim)
        self.client_head = nn.Linear(p, num_clients)
        for mod in (self.target_proj, self.head, self.client_proj, self.client_head):
            for lin in mod.modules():  # official init of the projections and heads: He (fan_in), zero bias
                if isinstance(lin, nn.Linear):
                    nn.init.kaiming_normal_(lin.weight, mode="fan_in", nonlinearity="relu")
                    nn.init.zeros_(lin.bias)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        f = self.backbone(x)
        return self.head(self.target_proj(f)), self.client_head(self.client_proj(f))

    def target_logits(self, x: Tensor) -> Tensor:
        return self.head(self.target_proj(self.backbone(x)))

    def client_logits(self, x: Tensor) -> Tensor:
        return self.client_head(self.client_proj(self.backbone(x)))


def feddrm_loss(target_logits: Tensor, client_logits: Tensor, y: Tensor, cid: int, lam: float):
    """(loss, target CE, client CE): every sample on client `cid` has client label `cid`; both CEs are
    batch means (Sec. 2.4; Algorithm 1, line 9: lambda weighs the TARGET loss)."""
    ce_target = F.cross_entropy(target_logits, y)
    ce_client = F.cross_entropy(client_logits, torch.full_like(y, cid))
    return lam * ce_target + (1.0 - lam) * ce_client, ce_target, ce_client


def log_size_prior(train_sizes) -> Tensor:
    """log(n_i / N) per client; +inf for an empty client, so that density-ratio routing never picks it."""
    n = torch.tensor([float(s) for s in train_sizes], dtype=torch.float64)
    prior = torch.log(n / n.sum())
    return torch.where(n > 0, prior, torch.full_like(prior, math.inf))


def route_scores(client_logits: Tensor, log_prior: Tensor, rule: str) -> Tensor:
    """Routing scores: posterior = the client logits (argmax P(client | x), prior n_i/N included);
    density_ratio = logits - log(n_i/N), i.e. dP_X^(i)/dP_X^(0)(x) of Eq. 4 up to a common factor (the official
    camera-ready code's rule). The prior is subtracted from the logits, never from probabilities (log space,
    numerically stable)."""
    if rule == "posterior":
        return client_logits
    if rule == "density_ratio":
        return client_logits - log_prior.to(client_logits.device, client_logits.dtype)
    raise ValueError(f"unknown routing rule {rule!r}; choices: {', '.join(ROUTING_RULES)}")


class FedDRMClient(ClientModule):
    metric_directions = {"ce_target": LOWER, "ce_client": LOWER}
    has_global_model = False  # the shared part has no target head of its own; the router is evaluated instead

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        backbone, feature_dim = self.model.without_projection()  # FedDRM builds both of its projections itself
        self.model = FedDRMNet(backbone, feature_dim, data.num_classes, data.num_clients, cfg.model.proj_dim)
        # the server knows every n_i (aggregation weights); density-ratio routing needs them too
        self.register_buffer("log_prior", log_size_prior(data.train_sizes()), persistent=False)  # float64; cast at use

    def is_private(self, key: str) -> bool:
        return key.startswith(HEAD)  # the target head (alpha_i, beta_i) never leaves the client

    def forward(self, x: Tensor) -> Tensor:
        return self.model.target_logits(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        target_logits, client_logits = self.model(x)
        loss, ce_target, ce_client = feddrm_loss(target_logits, client_logits, y, self.cid, self.hp.lam)
        return {"loss": loss, "ce_target": ce_target.detach(), "ce_client": ce_client.detach()}

    # Routing compares client scores by argmax, and its log prior is a density-ratio correction: both in float32
    # under mixed precision, the whole client branch included (bf16 scores changed 0.72% of routing decisions,
    # 0.28% of queries were exact bf16 ties; a float32 client head on bf16 features still changed some)
    @float32_island
    def route_scores(self, x: Tensor) -> Tensor:
        return route_scores(self.model.client_logits(x), self.log_prior, self.hp.routing)

    @float32_island
    def client_scores(self, x: Tensor) -> Tensor:
        return self.model.client_logits(x)  # the official "client accuracy" is their raw argmax, whatever the rule


# the server step is FedAvg's: the n_i-weighted mean of the uploaded (shared) parameters
register_method("feddrm", FedDRMConfig, FedDRMClient, Server, headline="test/system_acc")
