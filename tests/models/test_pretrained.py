"""model.pretrained: a local state-dict file or a torchvision weights name in torch's hub cache; weights that are
not there (and no download allowed) stop the run in one line before anything is written; and a model that
cannot take the data's inputs is a configuration error found before the run directory exists."""
import pytest
import torch
import torchvision
from omegaconf import OmegaConf

from fl.config import ConfigError
from fl.core import build_model
from fl.run.train import main
from tests.helpers import tiny


def cfg_for(name: str, **model):
    return OmegaConf.create({"model": {"name": name, "width": 8, "norm": "none", "groups": 0, "stem": "auto",
                                       **model}})


def test_a_state_dict_file_is_loaded_and_the_head_only_where_its_shape_fits(tmp_path):
    torch.manual_seed(1)
    source = build_model(cfg_for("cnn"), (3, 16, 16), 10)
    path = tmp_path / "weights.pt"
    torch.save(source.state_dict(), path)
    same = build_model(cfg_for("cnn", pretrained=str(path)), (3, 16, 16), 10)
    assert all(torch.equal(v, same.state_dict()[k]) for k, v in source.state_dict().items())
    other = build_model(cfg_for("cnn", pretrained=str(path)), (3, 16, 16), 4)  # another task: a new head
    assert all(torch.equal(v, other.backbone.state_dict()[k]) for k, v in source.backbone.state_dict().items())
    assert other.head.weight.shape == (4, source.feature_dim)


def test_the_wrapped_networks_own_keys_load_into_the_backbone_without_its_classifier(tmp_path):
    """A torchvision-style file (no backbone. prefix, an fc classifier) goes into the backbone; fc is dropped."""
    torch.manual_seed(2)
    source = build_model(cfg_for("cnn"), (3, 16, 16), 10)
    path = tmp_path / "tv.pt"
    torch.save({**source.backbone.state_dict(), "fc.weight": torch.zeros(1000, 64), "fc.bias": torch.zeros(1000)},
               path)
    model = build_model(cfg_for("cnn", pretrained=str(path)), (3, 16, 16), 10)
    assert all(torch.equal(v, model.backbone.state_dict()[k]) for k, v in source.backbone.state_dict().items())


def test_a_cached_torchvision_weights_name_loads_from_the_hub_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    weights = torchvision.models.get_weight("ResNet50_Weights.IMAGENET1K_V2")
    cache = tmp_path / "torch" / "hub" / "checkpoints" / weights.url.rsplit("/", 1)[1]
    cache.parent.mkdir(parents=True)
    torch.manual_seed(3)
    fake = torchvision.models.resnet50(weights=None).state_dict()  # random weights in the cached file's place
    torch.save(fake, cache)
    model = build_model(cfg_for("resnet50", pretrained="ResNet50_Weights.IMAGENET1K_V2"), (3, 32, 32), 7)
    assert torch.equal(model.backbone.conv1.weight, fake["conv1.weight"])
    assert model.head.weight.shape == (7, 2048)


@pytest.mark.parametrize("spec, message", [
    ("ResNet50_Weights.IMAGENET1K_V2", "not on disk at"),
    ("NoSuchWeights.V9", "neither a file nor a torchvision weights name"),
])
def test_weights_that_cannot_be_had_stop_in_one_line_before_anything_is_written(out, monkeypatch, capsys, spec,
                                                                                message):
    monkeypatch.setenv("TORCH_HOME", str(out / "empty-cache"))
    assert main(tiny(out, "model.name=resnet50", f"model.pretrained={spec}", "data.image_size=32")) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and message in err and "model.pretrained" in err
    assert not (out / "outputs").exists()


def test_a_file_of_another_model_names_the_mismatched_tensors(tmp_path):
    path = tmp_path / "other.pt"
    torch.save(build_model(cfg_for("cnn", width=4), (3, 16, 16), 10).state_dict(), path)
    with pytest.raises(ConfigError, match="wrong shape for .* backbone"):
        build_model(cfg_for("cnn", width=8, pretrained=str(path)), (3, 16, 16), 10)
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="cannot read it as a state dict"):
        build_model(cfg_for("cnn", pretrained=str(tmp_path / "junk.pt")), (3, 16, 16), 10)


def test_a_model_that_cannot_take_the_inputs_is_a_config_error_before_the_run_directory(out, capsys):
    assert main(tiny(out, "model.name=alexnet_bn")) == 2  # AlexNet on 16 px images
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "model.name='alexnet_bn' cannot take the inputs" in err
    assert not (out / "outputs").exists()
