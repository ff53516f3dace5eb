"""Models registered by name. Every model is `head(backbone(x))`, so methods can share or keep either part."""
from __future__ import annotations

from omegaconf import DictConfig

from fl.models.small import BackboneHead, cnn, logistic, mlp  # noqa: F401  (registers the models)
from fl.models import pfedfda_cnn, resnet  # noqa: F401,E402  (registers resnet18, cifarnet, emnistnet)
from fl.models import fedmosaic_nets  # noqa: F401,E402  (alexnet_bn, vit_s16, vit_mini, fedct_cnn)
from fl.registry import MODELS


def build_model(cfg: DictConfig, input_shape: tuple, num_classes: int) -> BackboneHead:
    return MODELS[cfg.model.name](cfg.model, tuple(input_shape), num_classes)


__all__ = ["BackboneHead", "build_model"]
