"""Models registered by name (`model.name`); `fl.core.build_model` builds the configured one. Every model is
`head(backbone(x))` (BackboneHead), so methods can share or keep either part."""
# importing the modules registers their models: alexnet_bn, vit_s16, vit_mini, fedct_cnn, cifarnet, emnistnet,
# resnet18, resnet50
from fl.models import fedmosaic_nets, pfedfda_cnn, resnet, torchvision_nets  # noqa: F401
from fl.models.small import BackboneHead, cnn, logistic, mlp  # noqa: F401  (registers cnn, mlp, logistic)

__all__ = ["BackboneHead"]
