"""Where the data keys live (issue 26, item 16): a key written under the wrong data block is refused naming the
block that has it, and a per-seed data file (`data.root=..._s${seed}.npz`, as docs/data.md documents) gives each
seed of a sweep its own file."""
from __future__ import annotations

import numpy as np
import pytest

from fl.config import ConfigError, load_config


@pytest.mark.parametrize("arg, home", [
    # the README's "Further options" listed these under data.partition.
    ("data.partition.train_fraction=0.5", "data.train_fraction"),
    ("data.partition.test_split=official", "data.test_split"),
    ("data.partition.public_size=10", "data.public_size"),
    ("data.partition.client_transform=cifar_s", "data.client_transform.name"),
    ("data.target.val_fraction=0.1", "data.val_fraction"),
    ("data.alpha=0.3", "data.partition.alpha"),
    ("data.partition.val_size=10", "data.target.val_size"),
    ("data.partition.noise=0.1", "data.embedded.noise"),
])
def test_a_data_key_under_the_wrong_block_names_its_block(arg, home):
    with pytest.raises(ConfigError) as err:
        load_config([arg])
    key = arg.split("=")[0]
    assert str(err.value).startswith(f"unknown key '{key}': ") and f"write {home}" in str(err.value)


def test_a_key_in_two_blocks_names_both():
    with pytest.raises(ConfigError, match=r"write data\.drop_labels or data\.target\.drop_labels"):
        load_config(["data.partition.drop_labels=[[0]]"])


def test_per_seed_data_files(tmp_path):
    """Each seed reads its own file: through a config, and through the sweep runner's plan of a seeds sweep."""
    from fl.data import build_data
    from fl.sweep.runner import plan_points
    from fl.sweep.spec import parse_sweep

    for seed, n in ((0, 40), (1, 60)):
        rng = np.random.default_rng(seed)
        np.savez(tmp_path / f"mine_s{seed}.npz", x=rng.normal(size=(n, 5)).astype(np.float32), y=np.arange(n) % 2)
    per_seed = f"data.root={tmp_path}/mine_s${{seed}}.npz"
    common = ["data.name=arrays", per_seed, "data.num_clients=2", "data.partition.min_client_size=2"]
    for seed, n in ((0, 40), (1, 60)):
        data = build_data(load_config(common + [f"seed={seed}"]))
        assert sum(data.train_sizes()) + sum(len(c.test) for c in data.clients) == n
    command = ["python", "-m", "fl.train", per_seed, "${args_no_hyphens}"]
    sweep = parse_sweep({"name": "s", "method": "grid", "command": command, "parameters": {"seed": {"values": [0, 1]}}})
    in_command = plan_points(sweep, [{}], tmp_path / "out", [0, 1], ["data.name=arrays"])
    sweep.fixed_args.remove(per_seed)
    as_extra = plan_points(sweep, [{}], tmp_path / "out", [0, 1], ["data.name=arrays", per_seed])
    for jobs in (in_command, as_extra):
        assert [job.config["data.root"] for job in jobs] == [f"{tmp_path}/mine_s0.npz", f"{tmp_path}/mine_s1.npz"]
