"""FedNH (Dai et al., AAAI 2023): fixed class prototypes, spread uniformly on the unit hypersphere, are the classifier;
the server infuses class semantics into them with a smoothed average of the clients' class means.

The paper's method (its Sec. on the proposed method and Algorithm 1), with P_c the prototype of class c:

    server, at the start:  P_c uniformly spread on the unit hypersphere (uniformity; the authors' code draws an
                           orthogonal matrix, so for C <= d the prototypes are orthonormal)
    client k:              logits = s * <f(x) / ||f(x)||, P_c>, cross-entropy; the backbone f (and s) train, the
                           prototypes stay fixed; after training,
                           mu_{k,c} = normalise(mean of f(x)/||f(x)|| over the client's samples of class c)
    server:                backbone (and s) averaged as FedAvg;
                           Pbar_c = normalise(sum_k n_{k,c} mu_{k,c} / sum_k n_{k,c})   (n_{k,c}: class counts)
                           P_c   <- normalise(rho * P_c + (1 - rho) * Pbar_c)          (semantics, smoothed by rho)

How it maps onto this framework:
- The model's linear head is replaced by `CosineHead`: the prototypes are a buffer (broadcast with the global model,
  never trained nor uploaded: the server owns them) and s a parameter (`method.learn_s`, the authors' code learns it
  from `method.s`) or a buffer. `forward` is the cosine classifier, so evaluation, the evaluators and fine-tuning
  rounds all score it.
- The initial prototypes come from a generator seeded by (seed, 0, -1, "fednh/prototypes"), independent of the
  model's initialisation; they live in the server's global model, so checkpoints carry them.
- Each client sends (mu_k, n_k) as its message after local training: one pass of the trained model, in eval mode and
  without augmentation, over its training split. A class no client of the round has keeps its prototype; rho = 1
  never moves them (FedUH, the authors' uniformity-only variant).
- The prototype update is summed in float64 in client order, so 1 and 2 processes agree.
- Pbar_c is normalised before the smoothing, as the authors' code does (prototype-count weights, its default
  aggregation; the confidence-weighted variant of the code is not implemented).
- The backbone average is weighted by n_i, as FedAvg here (`method.param_weighting=samples`); the authors' code
  averages the round's clients uniformly (`param_weighting=uniform`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fl.config import MethodConfig, param
from fl.core import HEAD, ClientModule, Server, Upload, generator, register_method
from fl.core.label_sums import class_sums

PROTOTYPES = HEAD + "prototypes"


@dataclass
class FedNHConfig(MethodConfig):
    name: str = "fednh"
    rho: float = param(0.9, ge=0.0, le=1.0, search={"values": [0.5, 0.7, 0.9, 0.95, 0.99]},
                       help="rho: smoothing of the prototype update, P <- normalise(rho P + (1 - rho) Pbar); "
                       "1 = fixed prototypes (FedUH)")
    s: float = param(1.0, gt=0.0, help="s: scale of the cosine logits s <f(x)/||f(x)||, P_c> (its initial value "
                     "when learn_s)")
    learn_s: bool = param(True, help="train s with the backbone (averaged like it), as the authors' code does")
    prototype_init: str = param("orthogonal", choices=["orthogonal", "random"],
                                help="orthogonal: rows of a random orthogonal matrix (orthonormal when classes <= "
                                "feature dim; the authors' code); random: independent uniform draws on the sphere")
    param_weighting: str = param("samples", choices=["samples", "uniform"],
                                 help="weights of the backbone average: samples = n_i (FedAvg), uniform = 1 per "
                                 "client of the round (the authors' code)")


def init_prototypes(num_classes: int, dim: int, gen: torch.Generator, kind: str = "orthogonal") -> Tensor:
    """Unit-norm prototypes [C, d], spread on the hypersphere: orthogonal (a Haar-random orthogonal frame, its rows
    orthonormal when C <= d, else unit rows of a matrix with orthonormal columns) or random (normalised Gaussians,
    uniform on the sphere). Drawn where `gen` lives (the CPU), under any device context; the caller moves them."""
    a = torch.randn(num_classes, dim, generator=gen, dtype=torch.float64, device=gen.device)
    if kind == "orthogonal":
        tall = a if num_classes > dim else a.T
        q, r = torch.linalg.qr(tall)  # reduced QR; the sign fix makes q unique, hence Haar-distributed
        q = q * torch.where(torch.diagonal(r) < 0, -1.0, 1.0)
        a = q if num_classes > dim else q.T
    return F.normalize(a, dim=1)


def update_prototypes(prototypes: Tensor, messages: list[dict[str, Tensor]], rho: float) -> Tensor:
    """P_c <- normalise(rho P_c + (1 - rho) Pbar_c), Pbar_c = normalise(sum_k n_{k,c} mu_{k,c} / sum_k n_{k,c});
    classes without samples in `messages` keep P_c. Summed in float64 in the order given."""
    P = prototypes.detach().double()
    sums, counts = torch.zeros_like(P), torch.zeros(P.shape[0], dtype=torch.float64, device=P.device)
    for m in messages:
        n = m["counts"].to(P.device, torch.float64)
        sums += n[:, None] * m["prototypes"].to(P.device, torch.float64)
        counts += n
    seen = counts > 0
    new = P.clone()
    pbar = F.normalize(sums[seen] / counts[seen, None], dim=1)
    new[seen] = F.normalize(rho * P[seen] + (1.0 - rho) * pbar, dim=1)
    return new.to(prototypes.dtype)


class CosineHead(nn.Module):
    """logits = s * <z / ||z||, P_c> with fixed unit-norm prototypes P (rows)."""

    def __init__(self, prototypes: Tensor, s: float, learn_s: bool):
        super().__init__()
        self.register_buffer("prototypes", prototypes)
        s = torch.tensor(float(s), dtype=prototypes.dtype)
        if learn_s:
            self.s = nn.Parameter(s)
        else:
            self.register_buffer("s", s)

    def forward(self, z: Tensor) -> Tensor:
        return self.s * F.linear(F.normalize(z, dim=1), self.prototypes.to(z.dtype))


class FedNHClient(ClientModule):
    needs_backbone = True

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        gen = generator(cfg.seed, 0, -1, "fednh/prototypes")
        protos = init_prototypes(data.num_classes, self.model.feature_dim, gen, self.hp.prototype_init)
        self.model.head = CosineHead(protos.to(torch.get_default_dtype()), self.hp.s, self.hp.learn_s)
        self._local: dict[str, Tensor] = {}

    def server_owned(self, key: str) -> bool:
        """The head's buffers (the prototypes, a fixed s): set by the server, never averaged."""
        return key.startswith(HEAD) and key[len(HEAD):] in dict(self.model.head.named_buffers())

    def on_local_train_start(self) -> None:
        self._local = {}

    def on_local_train_end(self) -> None:
        self._local = self.local_prototypes()

    def local_prototypes(self) -> dict[str, Tensor]:
        """mu_{k,c} (normalised means of the normalised features per class; zero rows for absent classes) and the
        class counts n_{k,c}, from the trained model over this client's training split."""
        split = self.train_split(self.data, self.cid)
        dim = self.model.feature_dim
        sums = torch.zeros(self.num_classes, dim, dtype=torch.float64, device=self.device)
        counts = torch.zeros(self.num_classes, dtype=torch.float64, device=self.device)
        for z, y in self.eval_pass(split, lambda x: F.normalize(self.model.backbone(x), dim=1)):
            sums += class_sums(z, y, self.num_classes)  # deterministic on CUDA, where index_add_ is not
            counts += torch.bincount(y, minlength=self.num_classes).double()
        mu = F.normalize(sums / counts.clamp(min=1.0)[:, None], dim=1)
        dtype = self.model.head.prototypes.dtype  # sent in the model's precision; the server sums in float64
        return {"prototypes": mu.to(dtype), "counts": counts.to(dtype)}

    def upload(self) -> Upload:
        up = super().upload()
        up.params = {k: v for k, v in up.params.items() if not self.server_owned(k)}
        up.message = dict(self._local)
        return up


class FedNHServer(Server):
    def weight(self, cid: int, upload: Upload) -> float:
        return 1.0 if self.hp.param_weighting == "uniform" else upload.weight

    def server_step(self, ctx, mean: dict[str, Tensor], messages: dict[int, dict[str, Any]]) -> None:
        new = dict(self.global_params)
        new.update(mean)  # the backbone (and a learned s) as FedAvg; the head's buffers are not uploaded
        msgs = [messages[c] for c in sorted(messages) if messages[c]]
        if msgs:
            new[PROTOTYPES] = update_prototypes(self.global_params[PROTOTYPES], msgs, float(self.hp.rho))
        self.global_params = new


register_method("fednh", FedNHConfig, FedNHClient, FedNHServer)
