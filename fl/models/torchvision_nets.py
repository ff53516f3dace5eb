"""torchvision's ImageNet architectures as BackboneHeads, for fine-tuning pretrained weights (`model.pretrained`)."""
from __future__ import annotations

from torch import nn

from fl.core.registry import register_model
from fl.models.small import BackboneHead


@register_model("resnet50")
def resnet50(cfg, input_shape: tuple, num_classes: int) -> BackboneHead:
    """torchvision's ResNet-50 (BatchNorm, ImageNet stem): 2048-d features, a new linear head. FedPALS fine-tunes
    it from ImageNet weights on PACS at 224 px (App. A.3)."""
    import torchvision  # loads when the model is built, not with the CLI

    net = torchvision.models.resnet50(weights=None)
    if input_shape[0] != 3:
        net.conv1 = nn.Conv2d(input_shape[0], 64, 7, 2, 3, bias=False)
    net.fc = nn.Identity()
    return BackboneHead(net, 2048, num_classes)
