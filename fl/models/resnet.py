"""ResNet-18 (He et al. 2016) as a `BackboneHead`: 512-d features after global average pooling, linear head.

`model.norm` picks the normalisation (batch | group | none). GroupNorm uses `model.groups` groups per layer,
or channels // 32 groups when it is 0 (the groups of 32 channels of pFedFDA's ResNet-18-GN); it keeps no
running statistics, which is why FL papers prefer it. `model.stem`: the CIFAR stem (3x3 conv, stride 1, no
max-pool) keeps 32x32 inputs at full resolution in the first stage; the ImageNet stem (7x7/2 conv + 3x3/2
max-pool) is what pFedFDA's code uses on 64x64 TinyImageNet (16x16 after the stem, 4x less compute).
"""
from __future__ import annotations

from torch import Tensor, nn

from fl.config import ConfigError
from fl.core.registry import register_model
from fl.models.small import BackboneHead


def _norm(kind: str, channels: int, groups: int) -> nn.Module:
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind == "group":
        g = groups or max(1, channels // 32)
        if channels % g:
            raise ConfigError(f"model.groups={groups} must divide every ResNet width (64, 128, 256, 512)")
        return nn.GroupNorm(g, channels)
    return nn.Identity()


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, norm):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = norm(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = norm(cout)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), norm(cout))

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


def resnet18_backbone(in_channels: int, image_size: int, norm_kind: str = "group", groups: int = 0,
                      stem: str = "auto", zero_init_residual: bool = False) -> nn.Sequential:
    def norm(c: int) -> nn.Module:
        return _norm(norm_kind, c, groups)

    if stem == "auto":
        stem = "cifar" if image_size <= 32 else "imagenet"
    if stem == "cifar":
        layers = [nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False), norm(64), nn.ReLU(inplace=True)]
    else:
        layers = [nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False), norm(64), nn.ReLU(inplace=True),
                  nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
        layers += [BasicBlock(cin, cout, stride, norm), BasicBlock(cout, cout, 1, norm)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    backbone = nn.Sequential(*layers)
    # He initialisation for convs, unit scale / zero shift for norms (torchvision's and pFedFDA's choice)
    for m in backbone.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    if zero_init_residual:  # each residual branch starts at zero: the block is the identity (then the ReLU)
        for m in backbone.modules():
            if isinstance(m, BasicBlock) and isinstance(m.bn2, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.zeros_(m.bn2.weight)
    return backbone


@register_model("resnet18")
def resnet18(cfg, input_shape: tuple, num_classes: int) -> BackboneHead:
    """CIFAR-style ResNet-18; the feature dimension is 512 whatever `model.width` says."""
    c, h, w = input_shape
    backbone = resnet18_backbone(c, min(h, w), cfg.norm, cfg.get("groups", 0), cfg.get("stem", "auto"),
                                 cfg.get("zero_init_residual", False))
    return BackboneHead(backbone, 512, num_classes)
