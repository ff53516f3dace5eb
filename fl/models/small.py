"""Small models for CPU-scale experiments: a CNN, an MLP and multinomial logistic regression."""
from __future__ import annotations

import math

from torch import Tensor, nn

from fl.core.registry import register_model
from fl.models.pretrained import load_into, state_dict_from


class BackboneHead(nn.Module):
    """`backbone` maps inputs to features of size `feature_dim`; `head` is the linear classifier."""

    def __init__(self, backbone: nn.Module, feature_dim: int, num_classes: int):
        super().__init__()
        self.backbone = backbone
        self.feature_dim = feature_dim
        self.head = nn.Linear(feature_dim, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.backbone(x))

    def load_pretrained(self, spec: str, download: bool = False) -> None:
        """Weights from `model.pretrained` (fl/models/pretrained.py)."""
        load_into(self, state_dict_from(spec, download), spec)

    def add_projection(self, dim: int) -> None:
        """Put Linear(feature_dim -> dim) + LayerNorm + ReLU between the backbone and a new head (`model.proj_dim`,
        the network FedDRM's baselines share: Sec. 3.1, its network minus the client branch). The projection is
        part of the backbone, so methods that share the backbone share it; both new Linear layers start as the
        official FedDRM code starts them: He normal (fan_in), zero bias."""
        self.backbone = Projected(self.backbone, self.feature_dim, dim)
        self.feature_dim = dim
        self.head = nn.Linear(dim, self.head.out_features)
        for lin in (self.backbone.proj[0], self.head):
            nn.init.kaiming_normal_(lin.weight, mode="fan_in", nonlinearity="relu")
            nn.init.zeros_(lin.bias)

    def without_projection(self) -> tuple[nn.Module, int]:
        """The backbone before `add_projection` and the width of its features."""
        if isinstance(self.backbone, Projected):
            return self.backbone.body, self.backbone.in_features
        return self.backbone, self.feature_dim


class Projected(nn.Module):
    """body -> Linear -> LayerNorm -> ReLU."""

    def __init__(self, body: nn.Module, in_features: int, dim: int):
        super().__init__()
        self.body, self.in_features = body, in_features
        self.proj = nn.Sequential(nn.Linear(in_features, dim), nn.LayerNorm(dim), nn.ReLU())

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.body(x))


@register_model("cnn")
def cnn(cfg, input_shape: tuple, num_classes: int) -> BackboneHead:
    """Two conv blocks and a hidden layer (the FedAvg-paper CNN, scaled by `model.width`)."""
    c, h, w = input_shape
    width = cfg.width

    def block(cin: int, cout: int) -> list:
        norm = {"none": [], "batch": [nn.BatchNorm2d(cout)], "group": [nn.GroupNorm(min(8, cout), cout)]}[cfg.norm]
        return [nn.Conv2d(cin, cout, 3, padding=1), *norm, nn.ReLU(), nn.MaxPool2d(2)]

    backbone = nn.Sequential(
        *block(c, width), *block(width, 2 * width),
        nn.Flatten(), nn.Linear(2 * width * (h // 4) * (w // 4), 4 * width), nn.ReLU(),
    )
    return BackboneHead(backbone, 4 * width, num_classes)


@register_model("mlp")
def mlp(cfg, input_shape: tuple, num_classes: int) -> BackboneHead:
    """Two hidden layers of 4 * model.width units on the flattened input (images or feature vectors)."""
    d = math.prod(input_shape)
    backbone = nn.Sequential(nn.Flatten(), nn.Linear(d, 4 * cfg.width), nn.ReLU(),
                             nn.Linear(4 * cfg.width, 4 * cfg.width), nn.ReLU())
    return BackboneHead(backbone, 4 * cfg.width, num_classes)


@register_model("logistic")
def logistic(cfg, input_shape: tuple, num_classes: int) -> BackboneHead:
    """Multinomial logistic regression on the flattened input: a linear head, no backbone parameters."""
    return BackboneHead(nn.Flatten(), math.prod(input_shape), num_classes)
