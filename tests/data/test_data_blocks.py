"""Every paper data block is a valid config, and its synthetic twin builds on the embedded data with the
same protocol (only dataset identity and sizes differ).

A twin block, conf/data/X_synthetic.yaml, is an overlay applied on top of conf/data/X.yaml, and a twin config,
conf/NAME_synthetic.yaml, includes its real config conf/NAME.yaml: a protocol fix reaches the twin by
construction."""
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from fl.config import CONF_DIR, load_config
from fl.data import build_data

BLOCKS = sorted(p.stem for p in (CONF_DIR / "data").glob("*.yaml") if not p.stem.endswith("_synthetic"))
SIZE_KEYS = {"name", "variant", "pool_splits", "embedded", "public_size", "partition.samples_per_client",
             "target.val_size", "partition.labels"}
# conf/NAME_synthetic.yaml with a conf/NAME.yaml beside it (fedpals_synthetic and hybrid_synthetic are settings
# of their own, not twins).
TWIN_CONFS = sorted(p.stem.removesuffix("_synthetic") for p in CONF_DIR.glob("*_synthetic.yaml")
                    if (CONF_DIR / f"{p.stem.removesuffix('_synthetic')}.yaml").is_file())


def leaves(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def is_size_key(key: str) -> bool:
    return key in SIZE_KEYS or key.split(".")[0] in SIZE_KEYS


def load_blocks(tmp_path: Path, *names: str, root: Path | None = None):
    conf = tmp_path / f"{names[-1]}.yaml"
    conf.write_text(f"include: [{', '.join(f'data/{n}' for n in names)}]\n")
    return load_config([f"conf={conf}", f"data.root={root or tmp_path / 'data'}"])


def includes(name: str) -> list:
    return yaml.safe_load((CONF_DIR / f"{name}.yaml").read_text()).get("include", [])


def test_there_is_a_block_for_each_paper_setting():
    for needed in ("domainnet_hybrid30", "office_hybrid20", "cifar10_c2_target", "cifar10s_dir05",
                   "cifar10_dir03_color", "cifar100_dir01", "cifar10_dir05", "pacs_target_fedpals",
                   "cifar100_dir01_20c", "cifar10_5spc_color"):
        assert needed in BLOCKS


@pytest.mark.parametrize("name", BLOCKS)
def test_block_is_valid_and_its_twin_builds_with_the_same_protocol(tmp_path, shared_data_root, name):
    real = load_blocks(tmp_path, name)
    twin = load_blocks(tmp_path, name, f"{name}_synthetic", root=shared_data_root)  # twins of a shape share images
    real_keys = yaml.safe_load((CONF_DIR / "data" / f"{name}.yaml").read_text())["data"]
    for key, value in leaves(real_keys).items():
        if not is_size_key(key):
            assert OmegaConf.select(twin.data, key) == value, key
    data = build_data(twin)
    assert twin.data.name in ("embedded", "embedded_domains")
    assert data.num_clients == real.data.num_clients
    has_target = real.data.target.distribution is not None or real.data.target.domain is not None
    assert (data.target is not None) == has_target
    assert (data.public is not None) == bool(real.data.public_size)


@pytest.mark.parametrize("name", BLOCKS)
def test_twin_block_is_an_overlay_without_protocol_keys(name):
    """The twin block sets only the dataset (data.name, data.embedded) and sizes; every protocol key comes
    from the real block it is applied on top of."""
    twin = yaml.safe_load((CONF_DIR / "data" / f"{name}_synthetic.yaml").read_text())
    assert set(twin) == {"data"}, f"data/{name}_synthetic: only data.* keys, no include"
    protocol = [key for key in leaves(twin["data"]) if not is_size_key(key)]
    assert not protocol, f"data/{name}_synthetic repeats protocol keys {protocol} of data/{name}"
    assert {"name", "embedded"} <= set(twin["data"])


def test_every_real_config_with_a_twin_is_found():
    assert len(TWIN_CONFS) >= 30 and "fedacd_cifar10_dir03" in TWIN_CONFS and "fedpals" not in TWIN_CONFS


def data_blocks(name: str) -> list:
    """The data blocks a config includes, directly or through the configs it includes."""
    found = []
    for inc in includes(name):
        found += [inc] if inc.startswith("data/") else [] if inc.startswith("protocol/") else data_blocks(inc)
    return found


@pytest.mark.parametrize("name", TWIN_CONFS)
def test_twin_config_includes_its_real_config(name):
    """conf/NAME_synthetic.yaml is include: [NAME, data/X_synthetic] (X the real config's data block), then at most
    twin overlays (conf/twin/: CPU-size overrides shared by the twins of one protocol), plus overrides: the real
    config's protocol reaches the twin by construction."""
    blocks = data_blocks(name)
    assert len(blocks) == 1, f"{name} includes one data block"
    found = includes(f"{name}_synthetic")
    assert found[:2] == [name, f"{blocks[0]}_synthetic"] and all(i.startswith("twin/") for i in found[2:]), found


@pytest.mark.parametrize("conf", ["pfedfda_cifar10_dir05", "pfedfda_cifar100", "pfedfda_cifar10s", "pfedfda_cifar100s",
                                  "pfedfda_tinyimagenet"])
def test_pfedfda_pools_the_official_splits_then_splits_each_client_80_20(tmp_path, conf):
    """The official code pools train and test (60k for CIFAR) before partitioning: every image of both splits
    lands in exactly one client, about 80% of each client's in its training split."""
    from tests import fakes

    root = tmp_path / "data"
    cfg = load_config([f"conf={conf}", f"data.root={root}", "data.num_clients=4", "data.partition.min_client_size=1",
                       "data.partition.balance=false"])
    assert cfg.data.pool_splits
    if cfg.data.name == "cifar10":
        fakes.cifar10(root, per_batch=40, n_test=100)
        total = 5 * 40 + 100
    elif cfg.data.name == "cifar100":
        fakes.cifar100(root, n_train=400, n_test=100)
        total = 400 + 100
    else:  # tiny-imagenet: 3 classes x 60 training images and 60 validation images
        fakes.tinyimagenet(root, per_class=60, n_val=60)
        total = 3 * 60 + 60
    data = build_data(cfg)
    assert sum(data.train_sizes()) + sum(data.test_sizes()) == total
    assert sum(data.train_sizes()) / total == pytest.approx(0.8, abs=0.02)


def test_feddrm_cifar20_dirichlet_is_drawn_on_the_fine_labels():
    """FedDRM's CIFAR-20 settings partition on CIFAR-100's 100 fine labels (the official code), Dir(0.3) as
    well as 25-SPC."""
    for conf in ("feddrm_cifar20_dir03", "feddrm_cifar20_25spc"):
        assert load_config([f"conf={conf}"]).data.partition.labels == "fine", conf
