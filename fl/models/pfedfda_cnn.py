"""The CNNs of pFedFDA's experiments (from FedPAC), with 128-d features before the linear head.

`cifarnet`: three conv blocks (5x5, 5x5, 3x3; 16/32/64 channels), LeakyReLU, max-pool, Linear -> 128.
`emnistnet`: two conv blocks (5x5; 16/32 channels), LeakyReLU, max-pool, Linear -> 128.
On their native inputs (3x32x32, 1x28x28) the backbones have 106,400 and 115,776 parameters (pFedFDA's
Table 8); other input sizes only change the flattened width of the last Linear.
"""
from __future__ import annotations

import torch
from torch import nn

from fl.core.registry import register_model
from fl.models.small import BackboneHead

FEATURE_DIM = 128


def _conv_stack(c: int, specs: list) -> list:
    layers = []
    for cout, k, pad in specs:
        layers += [nn.Conv2d(c, cout, k, padding=pad), nn.LeakyReLU(), nn.MaxPool2d(2)]
        c = cout
    return layers


def _backbone(input_shape: tuple, specs: list) -> nn.Sequential:
    convs = nn.Sequential(*_conv_stack(input_shape[0], specs), nn.Flatten())
    with torch.no_grad():
        flat = convs(torch.zeros(1, *input_shape)).shape[1]
    return nn.Sequential(*convs, nn.Linear(flat, FEATURE_DIM), nn.LeakyReLU())


@register_model("cifarnet")
def cifarnet(cfg, input_shape: tuple, num_classes: int) -> BackboneHead:
    """pFedFDA's CIFAR CNN (from FedPAC): three conv blocks (16/32/64 channels), 128-d features."""
    return BackboneHead(_backbone(input_shape, [(16, 5, 0), (32, 5, 1), (64, 3, 1)]), FEATURE_DIM, num_classes)


@register_model("emnistnet")
def emnistnet(cfg, input_shape: tuple, num_classes: int) -> BackboneHead:
    """pFedFDA's EMNIST CNN (from FedPAC): two conv blocks (16/32 channels), 128-d features."""
    return BackboneHead(_backbone(input_shape, [(16, 5, 0), (32, 5, 1)]), FEATURE_DIM, num_classes)
