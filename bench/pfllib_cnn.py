"""PFLlib's FedAvgCNN for 32 px images (two 5x5 conv blocks of 32 and 64 channels, a 512-unit hidden layer, a linear
head), registered into fl from outside as `model.name=pfllib_cnn` through `plugins=[bench.pfllib_cnn]`: the model of
bench/pfllib_compare.py."""
from torch import nn

from fl.core.registry import register_model
from fl.models.small import BackboneHead


@register_model("pfllib_cnn")
def pfllib_cnn(cfg, input_shape: tuple, num_classes: int) -> BackboneHead:
    c, h, w = input_shape
    side = lambda n: ((n - 4) // 2 - 4) // 2  # noqa: E731  two unpadded 5x5 convolutions, each pooled by 2
    backbone = nn.Sequential(nn.Conv2d(c, 32, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 5), nn.ReLU(),
                             nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64 * side(h) * side(w), 512), nn.ReLU())
    return BackboneHead(backbone, 512, num_classes)
