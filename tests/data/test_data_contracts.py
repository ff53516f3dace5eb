"""What a dataset, partition or client transform must keep, checked at the door (issue 34, item 4): a partition's
output (one integer array per client, in range, no sample given twice unless it registers overlap), a dataset's
layout and dtype (channels-last named with its fix) and one mean/std rule for every source, and settings that would
shadow a shared key refused when the plug-in registers. Each is one line, exit 2, and no run directory."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from fl.config import ConfigError, param
from fl.core import Split, registry
from fl.data.base import Pool, check_pool
from fl.data.federate import federate
from fl.run.train import main
from tests import fakes
from tests.data.test_partitions import data_cfg, make_pool
from tests.helpers import read_metrics, tiny


@pytest.fixture
def plugins():
    """Plug-ins a test registers are gone after it."""
    tables = (registry.DATASETS, registry.PARTITIONS, registry.CLIENT_TRANSFORMS)
    before = [dict(t) for t in tables]
    yield
    for table, saved in zip(tables, before):
        table.clear()
        table.update(saved)


def partition_returning(name: str, make, overlap: bool = False) -> None:
    registry.register_partition(name, overlap=overlap)(lambda c, num_clients, s, rng: make(len(c), num_clients))


def federate_with(partition: str, num_clients: int = 4):
    return federate(make_pool(), data_cfg({"partition.name": partition, "num_clients": num_clients}), seed=0)


@pytest.mark.parametrize("make, words", [
    (lambda n, k: np.array_split(np.arange(n), k - 1), ["returned 3 parts for 4", "data.num_clients=4"]),
    (lambda n, k: np.array_split(np.arange(n), k + 1), ["returned 5 parts for 4"]),
    (lambda n, k: [p.astype(np.float64) for p in np.array_split(np.arange(n), k)], ["client 0 float64 positions",
                                                                                    "astype(np.int64)"]),
    (lambda n, k: [np.arange(n) % 2 == i % 2 for i in range(k)], ["client 0 bool positions", "flatnonzero"]),
    (lambda n, k: [np.arange(i * 10, i * 10 + 10) for i in range(k - 1)] + [np.array([n])],
     ["client 3 position 600", "outside the 600 candidates"]),
    (lambda n, k: [np.arange(-1, 5)] + [np.arange(5 + i, 6 + i) for i in range(k - 1)], ["client 0 position -1"]),
    (lambda n, k: [np.arange(10)] * k, ["position 0 to clients 0, 1, 2, 3", "overlap=True"]),
    (lambda n, k: [np.array([3, 3])] + [np.array([4 + i]) for i in range(k - 1)], ["position 3 to client 0 twice"]),
    (lambda n, k: None, ["returned NoneType", "a list of 4 arrays"]),
])
def test_a_partition_that_breaks_its_contract_is_one_line_naming_it(plugins, make, words):
    partition_returning("broken", make)
    with pytest.raises(ConfigError) as err:
        federate_with("broken")
    message = str(err.value)
    assert message.startswith("data.partition.name='broken' ") and "\n" not in message
    for w in words:
        assert w in message, (w, message)


def test_a_partition_that_declares_overlap_may_give_a_sample_to_several_clients(plugins):
    shared = lambda n, k: [np.arange(10 * i, 10 * i + 20) for i in range(k)]  # noqa: E731  (neighbours share 10)
    partition_returning("sliding", shared, overlap=True)
    data = federate_with("sliding")
    sizes = [len(c.train) + len(c.test) for c in data.clients]
    assert sizes == [20] * 4  # every client got all of its 20 positions, 10 of them its neighbour's too
    pool_index = lambda c: set(torch.cat([c.train.x, c.test.x]).flatten().long().tolist())  # noqa: E731
    assert pool_index(data.clients[0]) & pool_index(data.clients[1])
    partition_returning("sliding_undeclared", shared)
    with pytest.raises(ConfigError, match="gave position 10 to clients 0, 1"):
        federate_with("sliding_undeclared")


def test_empty_parts_of_any_dtype_are_clients_without_data(plugins):
    partition_returning("one_empty", lambda n, k: [np.array([])] + np.array_split(np.arange(n), k - 1))
    data = federate_with("one_empty")
    assert len(data.clients[0].train) == len(data.clients[0].test) == 0
    assert sum(len(c.train) + len(c.test) for c in data.clients) == 600


def test_every_shipped_partition_keeps_the_contract():
    """The shipped partitions on a pool with domains, each with its default settings: the check passes them all."""
    pool = make_pool(n_per_class=30, domains=2, official_test=False)
    for name in registry.PARTITIONS:
        overrides = {"partition.name": name, "num_clients": 4}
        try:
            data = federate(pool, data_cfg(overrides), seed=0)
        except ConfigError as err:  # a setting this pool cannot satisfy is not a contract fault
            assert not str(err).startswith(f"data.partition.name='{name}' "), str(err)
            continue
        assert data.num_clients == 4, name


def test_a_broken_partition_on_the_command_line_exits_2_before_a_run_directory(plugins, out, capsys):
    partition_returning("three_parts", lambda n, k: np.array_split(np.arange(n), 3))
    assert main(tiny(out, "data.partition.name=three_parts")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: data.partition.name='three_parts' returned 3 parts for 6") and "\n" not in err
    assert not (out / "outputs").exists()


# ---- a dataset's layout, dtype and statistics --------------------------------------------------------------
def pool_of(x: torch.Tensor, **stats) -> Pool:
    return Pool("mine", Split(x, torch.arange(len(x)) % 3), None, 3, **stats)


U8 = torch.randint(0, 256, (12, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("x, stats, words", [
    (U8.permute(0, 2, 3, 1), {}, ["x of shape (12, 8, 8, 3) is channels-last", "permute(0, 3, 1, 2)",
                                  "(12, 3, 8, 8)"]),
    (U8.permute(0, 2, 3, 1).float(), {}, ["channels-last", "permute(0, 3, 1, 2)"]),
    (U8[:, 0], {}, ["uint8 of shape (12, 8, 8)", "unsqueeze(1)"]),
    (U8.long(), {}, ["x is int64", "uint8 images [N, C, H, W]", "floats"]),
    (U8.float(), {"mean": (0.5,) * 3, "std": (0.5,) * 3}, ["mean/std are set for float inputs", "leave them None"]),
    (U8, {"mean": (0.5,) * 3}, ["mean=(0.5, 0.5, 0.5) std=None", "both with 3 values"]),
    (U8, {"mean": (0.5,), "std": (0.5,)}, ["for 3-channel images"]),
])
def test_a_pool_out_of_layout_is_one_line_naming_the_fix(x, stats, words):
    with pytest.raises(ConfigError) as err:
        check_pool(pool_of(x, **stats), "data.name='mine'")
    message = str(err.value)
    assert message.startswith("data.name='mine': ") and "\n" not in message
    for w in words:
        assert w in message, (w, message)


def test_unset_statistics_are_one_half_per_channel_for_every_dataset():
    assert pool_of(U8).mean == pool_of(U8).std == (0.5, 0.5, 0.5)
    assert pool_of(U8[:, :1]).mean == (0.5,)
    assert pool_of(U8, mean=(0.0,) * 3, std=(1.0,) * 3).mean == (0.0,) * 3  # a dataset's own are kept
    assert pool_of(U8.float()).mean is None  # floats are used as they are
    check_pool(pool_of(U8), "x")
    check_pool(pool_of(U8.float() / 255), "x")


@dataclass
class Copied:
    file: str = param("", help="the arrays file whose pixels this dataset returns")


def test_two_datasets_with_the_same_pixels_and_no_statistics_train_identically(plugins, out):
    """A dataset of one's own that leaves mean/std unset and an `arrays` file without them: the same numbers (before,
    the first trained on [0, 1] pixels and the second on [-1, 1], 0.350 against 0.417 at round 2)."""
    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 256, (240, 3, 8, 8), dtype=np.uint8), np.arange(240) % 4
    path = fakes.arrays(out / "pixels.npz", x=x, y=y)

    @registry.register_dataset("copied", Copied)
    def copied(d) -> Pool:
        return Pool("copied", Split(torch.from_numpy(x), torch.from_numpy(y)), None, 4)  # no mean/std

    common = ["trainer.rounds=2", "fabric.cpu_threads=1", "data.num_clients=4", "data.partition.min_client_size=5"]
    assert main(tiny(out, *common, "data.name=arrays", f"data.root={path}", "logger.run_name=a")) == 0
    assert main(tiny(out, *common, "data.name=copied", "logger.run_name=b")) == 0
    a, b = (read_metrics(out / "outputs" / n) for n in "ab")
    assert a == b and a[-1]["test/acc_mean_clients"] > 0


def test_a_channels_last_dataset_stops_before_a_run_directory(plugins, out, capsys):
    @registry.register_dataset("nhwc")
    def nhwc(d) -> Pool:
        return pool_of(U8.permute(0, 2, 3, 1).repeat(20, 1, 1, 1))

    assert main(tiny(out, "data.name=nhwc")) == 2
    err = capsys.readouterr().err.strip()
    line = nhwc.__code__.co_firstlineno
    assert err.startswith(f"error: data.name='nhwc' (tests/data/test_data_contracts.py:{line}): x of shape (240, 8, "
                          "8, 3) is channels-last") and "\n" not in err
    assert not (out / "outputs").exists()


# ---- settings that would shadow a shared key ----------------------------------------------------------------
@pytest.mark.parametrize("register, key, block", [
    (registry.register_dataset, "root", "data.root"),
    (registry.register_dataset, "num_clients", "data.num_clients"),
    (registry.register_partition, "seed", "data.partition.seed"),
    (registry.register_client_transform, "after_augment", "data.client_transform.after_augment"),
    (registry.register_aggregator, "name", "server.aggregator.name"),
])
def test_a_setting_named_like_a_shared_key_is_refused_at_registration(plugins, register, key, block):
    settings = type("Settings", (), {"__annotations__": {key: str}, key: param("x")})
    with pytest.raises(ValueError) as err:
        register("shadowing", dataclass(settings))(lambda *a: None)
    message = str(err.value)
    assert f"'shadowing': its setting {key!r} has the name of {block}" in message and "\n" not in message
    assert all("shadowing" not in t for t in (registry.DATASETS, registry.PARTITIONS, registry.CLIENT_TRANSFORMS,
                                              registry.AGGREGATORS))
