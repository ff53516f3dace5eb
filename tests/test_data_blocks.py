"""Every paper data block is a valid config, and its synthetic twin builds on the embedded data with the
same protocol (only dataset identity and sizes differ)."""
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from fl.config import CONF_DIR, load_config
from fl.data import build_data

BLOCKS = sorted(p.stem for p in (CONF_DIR / "data").glob("*.yaml") if not p.stem.endswith("_synthetic"))
SIZE_KEYS = {"name", "variant", "pool_splits", "embedded", "public_size", "partition.samples_per_client",
             "partition.labels"}


def leaves(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def load_block(tmp_path: Path, name: str, *extra: str):
    conf = tmp_path / f"{name}.yaml"
    conf.write_text(f"include: [data/{name}]\n")
    return load_config([f"conf={conf}", f"data.root={tmp_path / 'data'}", *extra])


def test_there_is_a_block_for_each_paper_setting():
    for needed in ("domainnet_hybrid30", "office_hybrid20", "cifar10_c2_target", "cifar10s_dir05",
                   "cifar10_dir03_color", "cifar100_dir01", "cifar10_dir05", "pacs_target_fedpals",
                   "cifar100_dir01_20c", "cifar10_5spc_color"):
        assert needed in BLOCKS


@pytest.mark.parametrize("name", BLOCKS)
def test_block_is_valid_and_its_twin_builds_with_the_same_protocol(tmp_path, name):
    real = load_block(tmp_path, name)
    twin = load_block(tmp_path, f"{name}_synthetic")
    real_keys = yaml.safe_load((CONF_DIR / "data" / f"{name}.yaml").read_text())["data"]
    for key, value in leaves(real_keys).items():
        if key not in SIZE_KEYS and key.split(".")[0] not in SIZE_KEYS:
            assert OmegaConf.select(twin.data, key) == value, key
    data = build_data(twin)
    assert data.num_clients == real.data.num_clients
    has_target = real.data.target.distribution is not None or real.data.target.domain is not None
    assert (data.target is not None) == has_target
    assert (data.public is not None) == bool(real.data.public_size)
