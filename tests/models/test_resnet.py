"""ResNet-18 and pFedFDA CNNs: feature shapes, parameter counts against the papers, norm options."""
import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from fl.config import ConfigError, load_config
from fl.core import build_model
from fl.models.resnet import BasicBlock, resnet18_backbone


def make(name, shape, classes=10, **model):
    cfg = OmegaConf.create({"model": {"name": name, "width": 32, "norm": "group", "groups": 0, "stem": "auto",
                                      **model}})
    return build_model(cfg, shape, classes)


def count(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("shape,stem", [((3, 32, 32), "cifar"), ((3, 64, 64), "imagenet"), ((1, 28, 28), "cifar")])
def test_resnet18_feature_shape(shape, stem):
    torch.manual_seed(0)
    m = make("resnet18", shape, classes=7).eval()
    x = torch.randn(2, *shape)
    z = m.backbone(x)
    assert z.shape == (2, 512) and m.feature_dim == 512
    assert m(x).shape == (2, 7)
    assert isinstance(m.backbone[0], nn.Conv2d) and m.backbone[0].kernel_size == ((3, 3) if stem == "cifar" else (7, 7))
    assert any(isinstance(layer, nn.MaxPool2d) for layer in m.backbone) == (stem == "imagenet")


def test_resnet18_parameter_count_and_norms():
    # ImageNet stem, per-channel affine: the torchvision ResNet-18 backbone count (pFedFDA Table 8 lists
    # 11,167,212 for FedML's per-group affine, i.e. 9,300 fewer norm parameters)
    gn = make("resnet18", (3, 64, 64), stem="imagenet")
    assert count(gn.backbone) == 11_176_512
    groups = [mod.num_groups * 32 == mod.num_channels for mod in gn.modules() if isinstance(mod, nn.GroupNorm)]
    assert groups and all(groups)  # groups of 32 channels
    bn = make("resnet18", (3, 32, 32), norm="batch")
    assert any(isinstance(mod, nn.BatchNorm2d) for mod in bn.modules())
    assert not any(isinstance(mod, nn.GroupNorm) for mod in bn.modules())
    g2 = make("resnet18", (3, 32, 32), groups=2)
    assert {mod.num_groups for mod in g2.modules() if isinstance(mod, nn.GroupNorm)} == {2}
    with pytest.raises(ConfigError, match="model.groups"):
        make("resnet18", (3, 32, 32), groups=3)


def test_pfedfda_cnns_match_paper_parameter_counts():
    cifar = make("cifarnet", (3, 32, 32), classes=100)
    emnist = make("emnistnet", (1, 28, 28), classes=62)
    assert count(cifar.backbone) == 106_400 and count(emnist.backbone) == 115_776
    assert cifar.backbone(torch.randn(2, 3, 32, 32)).shape == (2, 128)
    assert emnist(torch.randn(2, 1, 28, 28)).shape == (2, 62)


@pytest.mark.parametrize("norm", ["group", "batch"])
def test_zero_init_residual_makes_every_block_start_as_the_identity(norm):
    """model.zero_init_residual (FedDRM's official code): the last norm of each residual branch starts at zero
    scale, so a block with an identity shortcut maps x to relu(x); the option off leaves them at one."""
    torch.manual_seed(0)
    on = resnet18_backbone(3, 32, norm, 16 if norm == "group" else 0, zero_init_residual=True).eval()
    off = resnet18_backbone(3, 32, norm, 16 if norm == "group" else 0).eval()
    blocks = [m for m in on.modules() if isinstance(m, BasicBlock)]
    assert len(blocks) == 8 and all(float(b.bn2.weight.detach().abs().sum()) == 0 for b in blocks)
    assert all(float((b.bn2.weight.detach() - 1).abs().sum()) == 0 for b in off.modules() if isinstance(b, BasicBlock))
    identity = [b for b in blocks if isinstance(b.shortcut, torch.nn.Identity)]
    x = torch.randn(2, 64, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(identity[0](x), torch.relu(x))
    assert load_config(["conf=feddrm_cifar10_dir03"]).model.zero_init_residual
