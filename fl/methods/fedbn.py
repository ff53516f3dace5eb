"""FedBN (Li et al., ICLR 2021): FedAvg on every layer except BatchNorm, which stays on each client.

Each client keeps its BatchNorm affine parameters (gamma, beta) and running statistics (mean, variance,
batch counter) to itself: they are never uploaded, never averaged and never overwritten by the server.
Everything else is averaged as in FedAvg (weights n_i). A client is evaluated with the shared layers and its
own BatchNorm layers; there is no global model (it would have no BatchNorm state of its own).

The BatchNorm layers are found by module type (nn.BatchNorm1d/2d/3d, SyncBatchNorm), so any model with
BatchNorm works; the small CNN has it with `model.norm=batch`.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from fl.config import ConfigError, MethodConfig
from fl.core import ClientModule, Server, register_method

BATCHNORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


@dataclass
class FedBNConfig(MethodConfig):
    name: str = "fedbn"


def batchnorm_prefixes(module: nn.Module) -> tuple[str, ...]:
    """State-dict prefixes ("model.backbone.1.") of every BatchNorm layer of `module`."""
    return tuple(f"{name}." for name, m in module.named_modules() if isinstance(m, BATCHNORMS))


class FedBNClient(ClientModule):
    has_global_model = False  # the shared layers have no BatchNorm state of their own

    def __init__(self, cfg, data):
        super().__init__(cfg, data)
        self._bn = batchnorm_prefixes(self)
        if not self._bn:
            raise ValueError(f"method 'fedbn' needs a model with BatchNorm layers; model.name={cfg.model.name!r} "
                             f"model.norm={cfg.model.norm!r} has none")

    def is_private(self, key: str) -> bool:
        return key.startswith(self._bn)


def resolve(cfg) -> None:
    if cfg.model.norm != "batch":
        raise ConfigError(f"method.name=fedbn keeps BatchNorm layers local: it needs model.norm=batch "
                          f"(got model.norm={cfg.model.norm!r})")


register_method("fedbn", FedBNConfig, FedBNClient, Server, resolve, needs=("model.norm=batch",))
