"""FedSAM (Qu et al., ICML 2022; Caldarola et al., ECCV 2022): FedAvg whose clients train with sharpness-aware
minimisation (SAM).

Each local step of client i on a batch B (Qu et al., Algorithm 1, the client update; SAM as in Foret et al., 2021):

    g   = grad L_B(w)
    eps = rho * g / ||g||_2                   (one norm over every trainable parameter)
    w  <- step(w, grad L_B(w + eps))          (the optimizer steps from w with the gradient taken at w + eps)

and the server averages the client models as FedAvg does (weights n_i).

How it maps onto this framework:
- Manual optimization: backward at w, perturb, backward at w + eps, restore w, `opt.step()`. w is restored from a
  copy rather than by subtracting eps, so the step starts from w bit for bit.
- Both passes see the same batch and the same dropout draws (torch's RNG is rewound for the second pass), since eps is
  the ascent direction of that one loss L_B; BatchNorm running statistics are updated by the first pass only, as
  FedAvg's single pass updates them. With rho = 0 a run is therefore FedAvg's exactly.
- The step is the setting's optimizer (`optim.*`): Qu et al.'s FedSAM steps plain SGD (their MoFedSAM adds momentum),
  FedDRM's code steps SGD with momentum 0.9 and weight decay 5e-4. Weight decay enters the step, not g.
- Under fp16 loss scaling g / ||g|| does not depend on the scale; a step with non-finite gradients is skipped by the
  scaler as usual, and w is still restored from its copy.
- FedSAM-FT (FedDRM's baseline) is this method followed by local fine-tuning rounds: `finetune.after_round=R`, the
  framework's fine-tuning protocol (plain cross-entropy steps, as FedDRM's code fine-tunes).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fl.config import MethodConfig, param
from fl.core import ClientModule, Server, register_method
from fl.core.metric_directions import LOWER


@dataclass
class FedSAMConfig(MethodConfig):
    name: str = "fedsam"
    rho: float = param(0.05, ge=0.0, search={"values": [0.01, 0.02, 0.05, 0.1, 0.2, 0.5]},
                       help="rho: radius of SAM's ascent step, eps = rho * g / ||g|| (0 = FedAvg)")


def _rng_state(device: torch.device):
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _set_rng_state(state, device: torch.device) -> None:
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)


@contextlib.contextmanager
def frozen_running_stats(module: nn.Module):
    """BatchNorm layers normalise by the batch's statistics without updating their running statistics (nor
    num_batches_tracked) inside the block."""
    layers = [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    for m in layers:
        m.track_running_stats = False
    try:
        yield
    finally:
        for m in layers:
            m.track_running_stats = True


def sam_perturbation(params: list[torch.nn.Parameter], rho: float) -> list[torch.Tensor | None]:
    """eps = rho * g / ||g||_2 from the parameters' current gradients (None where a parameter has none)."""
    grads = [p.grad for p in params]
    present = [g for g in grads if g is not None]
    if not present:
        return [None] * len(params)
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in present]))
    scale = rho / (norm + 1e-12)
    return [None if g is None else (g * scale).to(g.dtype) for g in grads]


class FedSAMClient(ClientModule):
    metric_directions = {"sam_loss": LOWER}

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        x, y = batch
        opt = self.optimizers()
        params = [p for p in self.parameters() if p.requires_grad]
        rng = _rng_state(x.device)
        opt.zero_grad()
        loss = F.cross_entropy(self(x), y)
        self.manual_backward(loss)
        with torch.no_grad():
            eps = sam_perturbation(params, float(self.hp.rho))
            saved = [p.detach().clone() for p in params]
            for p, e in zip(params, eps):
                if e is not None:
                    p.add_(e)
        opt.zero_grad()
        _set_rng_state(rng, x.device)  # the same dropout draws as the first pass
        with frozen_running_stats(self):
            perturbed = F.cross_entropy(self(x), y)
            self.manual_backward(perturbed)
        with torch.no_grad():
            for p, w in zip(params, saved):
                p.copy_(w)
        opt.step()
        # sam_loss - loss is the batch's sharpness estimate at radius rho
        return {"loss": loss.detach(), "sam_loss": perturbed.detach()}


register_method("fedsam", FedSAMConfig, FedSAMClient, Server)
