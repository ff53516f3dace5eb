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
             "partition.labels"}
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


def load_blocks(tmp_path: Path, *names: str):
    conf = tmp_path / f"{names[-1]}.yaml"
    conf.write_text(f"include: [{', '.join(f'data/{n}' for n in names)}]\n")
    return load_config([f"conf={conf}", f"data.root={tmp_path / 'data'}"])


def includes(name: str) -> list:
    return yaml.safe_load((CONF_DIR / f"{name}.yaml").read_text()).get("include", [])


def test_there_is_a_block_for_each_paper_setting():
    for needed in ("domainnet_hybrid30", "office_hybrid20", "cifar10_c2_target", "cifar10s_dir05",
                   "cifar10_dir03_color", "cifar100_dir01", "cifar10_dir05", "pacs_target_fedpals",
                   "cifar100_dir01_20c", "cifar10_5spc_color"):
        assert needed in BLOCKS


@pytest.mark.parametrize("name", BLOCKS)
def test_block_is_valid_and_its_twin_builds_with_the_same_protocol(tmp_path, name):
    real = load_blocks(tmp_path, name)
    twin = load_blocks(tmp_path, name, f"{name}_synthetic")
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


@pytest.mark.parametrize("name", TWIN_CONFS)
def test_twin_config_includes_its_real_config(name):
    """conf/NAME_synthetic.yaml is include: [NAME, data/X_synthetic] (X the real config's data block) plus
    overrides: the real config's protocol reaches the twin by construction."""
    blocks = [inc for inc in includes(name) if inc.startswith("data/")]
    assert len(blocks) == 1, f"{name} includes one data block"
    assert includes(f"{name}_synthetic") == [name, f"{blocks[0]}_synthetic"]
