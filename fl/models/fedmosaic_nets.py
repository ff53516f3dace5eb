"""The models FedMosaic's experiments use (Sec. 8, Table 4; where the paper names no model, those of the
FedBN and FedCT code), every one `head(backbone(x))`:

alexnet_bn  FedBN's AlexNet with BatchNorm for Office-Caltech10 / DomainNet at 256x256 (about 57M
            parameters; needs inputs of at least 64 px, so the synthetic twins use the small cnn)
vit_s16     ViT-S/16 trained from scratch (384 wide, 12 blocks, 6 heads) for DomainNet (Table 4)
vit_mini    a CPU-sized ViT with the same structure: patch 4, 4 blocks, 4 heads, 4 * model.width wide
fedct_cnn   FedCT's CIFAR-10 CNN: 3 blocks of 2 x conv3x3 [32, 64, 128] + BN + max-pool + dropout,
            FC 128 + BN + dropout, FC 10 (dropout 0.2/0.3/0.4/0.5 is our choice; not stated)
FedCT's FMNIST MLP (784-512-ReLU-512-ReLU-10) is the framework's `mlp` at model.width=128.
`model.width` and `model.norm` are ignored by alexnet_bn, vit_s16 and fedct_cnn (fixed architectures).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from fl.core.registry import register_model
from fl.models.small import BackboneHead


@register_model("alexnet_bn")
def alexnet_bn(cfg, input_shape: tuple, num_classes: int) -> BackboneHead:
    """FedBN's AlexNet with BatchNorm (Office-Caltech10 / DomainNet at 256 px, about 57M parameters; inputs of at
    least 64 px)."""
    c = input_shape[0]

    def conv(cin, cout, k, s, p):
        return [nn.Conv2d(cin, cout, k, s, p), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

    backbone = nn.Sequential(
        *conv(c, 64, 11, 4, 2), nn.MaxPool2d(3, 2),
        *conv(64, 192, 5, 1, 2), nn.MaxPool2d(3, 2),
        *conv(192, 384, 3, 1, 1), *conv(384, 256, 3, 1, 1), *conv(256, 256, 3, 1, 1), nn.MaxPool2d(3, 2),
        nn.AdaptiveAvgPool2d((6, 6)), nn.Flatten(),
        nn.Linear(256 * 6 * 6, 4096), nn.BatchNorm1d(4096), nn.ReLU(inplace=True),
        nn.Linear(4096, 4096), nn.BatchNorm1d(4096), nn.ReLU(inplace=True),
    )
    return BackboneHead(backbone, 4096, num_classes)


class ViTBackbone(nn.Module):
    """Patch embedding, a class token, learned position embeddings, pre-norm transformer blocks; the
    feature is the final-normalised class token."""

    def __init__(self, input_shape: tuple, patch: int, dim: int, depth: int, heads: int):
        super().__init__()
        c, h, w = input_shape
        if h % patch or w % patch:
            raise ValueError(f"ViT: image size {h}x{w} is not a multiple of the patch size {patch}")
        self.embed = nn.Conv2d(c, dim, patch, patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, 1 + (h // patch) * (w // patch), dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: Tensor) -> Tensor:
        tokens = self.embed(x).flatten(2).transpose(1, 2)
        tokens = torch.cat([self.cls.expand(x.shape[0], -1, -1), tokens], 1) + self.pos
        return self.norm(self.blocks(tokens)[:, 0])


@register_model("vit_s16")
def vit_s16(cfg, input_shape: tuple, num_classes: int) -> BackboneHead:
    """ViT-S/16 trained from scratch (384 wide, 12 blocks, 6 heads), FedMosaic's DomainNet model (Table 4)."""
    return BackboneHead(ViTBackbone(input_shape, 16, 384, 12, 6), 384, num_classes)


@register_model("vit_mini")
def vit_mini(cfg, input_shape: tuple, num_classes: int) -> BackboneHead:
    """A CPU-sized ViT with vit_s16's structure: patch 4, 4 blocks, 4 heads, 4 * model.width wide."""
    dim = 4 * cfg.width
    return BackboneHead(ViTBackbone(input_shape, 4, dim, 4, 4), dim, num_classes)


@register_model("fedct_cnn")
def fedct_cnn(cfg, input_shape: tuple, num_classes: int) -> BackboneHead:
    """FedCT's CIFAR-10 CNN: 3 blocks of 2 x conv3x3 [32, 64, 128] + BN + max-pool + dropout, then FC 128."""
    c, h, w = input_shape

    def block(cin, cout, drop):
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                nn.MaxPool2d(2), nn.Dropout(drop)]

    backbone = nn.Sequential(*block(c, 32, 0.2), *block(32, 64, 0.3), *block(64, 128, 0.4), nn.Flatten(),
                             nn.Linear(128 * (h // 8) * (w // 8), 128), nn.BatchNorm1d(128), nn.ReLU(inplace=True),
                             nn.Dropout(0.5))
    return BackboneHead(backbone, 128, num_classes)
