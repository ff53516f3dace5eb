"""Models registered by name (`model.name`); `fl.core.build_model` builds the configured one. Every model is
`head(backbone(x))` (BackboneHead), so methods can share or keep either part."""
from fl.models import fedmosaic_nets, pfedfda_cnn, resnet  # noqa: F401  (alexnet_bn, vit_*, fedct_cnn, cifarnet, emnistnet, resnet18)
from fl.models.small import BackboneHead, cnn, logistic, mlp  # noqa: F401  (registers cnn, mlp, logistic)

__all__ = ["BackboneHead"]
