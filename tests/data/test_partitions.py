"""Partitions and the Pool -> FederatedData pipeline on fabricated pools: shapes, disjointness,
determinism, the statistics each paper's split promises, and config errors for impossible requests."""
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from fl.config import ConfigError
from fl.config.blocks import chosen, schema
from fl.core import Split
from fl.data.base import Pool
from fl.data.federate import federate
from fl.data.partitions.classes import classes
from fl.data.partitions.dirichlet import dirichlet
from fl.data.partitions.shards import shards

K = 10


def make_pool(n_per_class=60, domains=0, official_test=True) -> Pool:
    def split(n):
        y = torch.arange(K).repeat_interleave(n)
        dom = None
        if domains:
            y, dom = y.repeat(domains), torch.arange(domains).repeat_interleave(len(y))
        x = torch.arange(len(y), dtype=torch.float32).view(-1, 1)  # x encodes the sample's index
        return Split(x, y, dom)
    return Pool("fake", split(n_per_class), split(n_per_class // 3) if official_test else None, K,
                domain_names=[f"d{i}" for i in range(domains)])


def data_cfg(overrides: dict):
    """The data config with `overrides` (dotted keys under data., e.g. "partition.name")."""
    picks = OmegaConf.create({"data": {"partition": {"name": overrides.get("partition.name", "dirichlet")}}})
    d = schema(chosen(picks)).data  # typed as a run's: the partition's own settings, no other's
    if "min_client_size" in d.partition:
        d.partition.min_client_size = 5
    for k, v in overrides.items():
        OmegaConf.update(d, k, v, merge=False)
    return d


def ids(split: Split) -> set:
    return set(split.x.flatten().long().tolist())


def test_clients_train_test_and_public_sets_are_disjoint_and_deterministic():
    pool = make_pool(official_test=False)
    fd = federate(pool, data_cfg({"num_clients": 8, "public_size": 50}), seed=3)
    again = federate(pool, data_cfg({"num_clients": 8, "public_size": 50}), seed=3)
    other = federate(pool, data_cfg({"num_clients": 8, "public_size": 50}), seed=4)
    seen = ids(fd.public)
    assert len(seen) == 50 and torch.equal(torch.bincount(fd.public.y), torch.full((K,), 5))
    for c in fd.clients:
        for s in (c.train, c.test):
            assert not (ids(s) & seen)
            seen |= ids(s)
    assert len(seen) == sum(len(c.train) + len(c.test) for c in fd.clients) + 50
    assert fd.fingerprint() == again.fingerprint() != other.fingerprint()
    assert all(torch.equal(a.train.x, b.train.x) for a, b in zip(fd.clients, again.clients))


def test_dirichlet_concentration_behaves_in_aggregate():
    labels = np.arange(K).repeat(200)

    def mean_max_share(alpha):  # share of a client's data in its most common class
        shares = []
        for s in range(5):
            for part in dirichlet(labels, 10, alpha, np.random.default_rng(s), min_size=1):
                shares.append(np.bincount(labels[part], minlength=K).max() / len(part))
        return np.mean(shares)
    assert mean_max_share(0.05) > mean_max_share(1.0) > mean_max_share(100.0)
    assert mean_max_share(100.0) < 0.2  # nearly uniform labels


def test_dirichlet_min_size_retry_and_impossible_requests_are_config_errors():
    labels = np.arange(K).repeat(50)
    parts = dirichlet(labels, 8, 0.3, np.random.default_rng(1), min_size=20)
    assert min(len(p) for p in parts) >= 20 and len(np.unique(np.concatenate(parts))) == 500
    with pytest.raises(ConfigError, match="data.partition.min_client_size"):
        dirichlet(labels, 8, 0.3, np.random.default_rng(1), min_size=100)
    with pytest.raises(ConfigError, match="raise data.partition.alpha"):
        dirichlet(labels, 20, 0.001, np.random.default_rng(1), min_size=24, max_tries=20)
    with pytest.raises(ConfigError, match="data.partition.classes_per_client"):
        classes(labels, 4, 11, np.random.default_rng(0))
    with pytest.raises(ConfigError, match="shards"):
        shards(labels, 100, 6, np.random.default_rng(0))


def test_balanced_dirichlet_caps_client_sizes():
    labels = np.arange(K).repeat(100)
    sizes = [len(p) for p in dirichlet(labels, 10, 0.1, np.random.default_rng(0), 1, balance=True)]
    free = [len(p) for p in dirichlet(labels, 10, 0.1, np.random.default_rng(0), 1, balance=False)]
    assert np.std(sizes) < np.std(free)


@pytest.mark.parametrize("assignment", ["round_robin", "random"])
def test_pathological_classes_per_client(assignment):
    labels = np.arange(K).repeat(30)
    parts = classes(labels, 15, 2, np.random.default_rng(0), assignment)
    assert all(len(np.unique(labels[p])) == 2 for p in parts)
    assert len(np.unique(np.concatenate(parts))) == sum(len(p) for p in parts)
    if assignment == "round_robin":  # 15 x 2 slots over 10 classes: every class held by 3 clients
        held = np.bincount(np.concatenate([np.unique(labels[p]) for p in parts]), minlength=K)
        assert (held == 3).all()
    else:  # NIID-Bench: client p holds class p mod K
        assert all(p % K in np.unique(labels[part]) for p, part in enumerate(parts))


def test_shards_give_each_client_at_most_s_classes_of_equal_size():
    labels = np.arange(K).repeat(40)
    parts = shards(labels, 8, 5, np.random.default_rng(0))
    assert all(len(p) == 50 for p in parts) and all(len(np.unique(labels[p])) <= 5 for p in parts)
    assert len(np.unique(np.concatenate(parts))) == 400


def test_domains_with_label_skew_is_fedmosaics_hybrid():
    pool = make_pool(n_per_class=20, domains=3)
    d = data_cfg({"num_clients": 15, "partition.name": "domains", "partition.clients_per_domain": 5,
                  "partition.within_domain": "classes", "test_split": "official"})
    fd = federate(pool, d, seed=0)
    for cid, c in enumerate(fd.clients):
        assert c.domain == cid // 5 and set(c.train.domain.tolist()) == {c.domain}
        classes = set(c.train.y.tolist())
        assert len(classes) == 2
        assert set(c.test.y.tolist()) == classes and set(c.test.domain.tolist()) == {c.domain}
    for dom in range(3):  # 5 clients x 2 classes cover each domain's 10 classes exactly once
        held = [set(c.train.y.tolist()) for c in fd.clients if c.domain == dom]
        assert sorted(k for h in held for k in h) == list(range(K))
    with pytest.raises(ConfigError, match="clients_per_domain"):
        federate(pool, data_cfg({"num_clients": 4, "partition.name": "domains", "partition.clients_per_domain": 2}),
                 seed=0)
    with pytest.raises(ConfigError, match="has none"):
        federate(make_pool(), data_cfg({"num_clients": 4, "partition.name": "domains"}), seed=0)


def test_official_test_follows_each_clients_label_mix():
    pool = make_pool(n_per_class=60)
    fd = federate(pool, data_cfg({"num_clients": 5, "partition.name": "classes", "partition.classes_per_client": 2,
                                  "test_split": "official"}), seed=0)
    assert len(fd.global_test) == len(pool.test)
    for c in fd.clients:
        train_h = torch.bincount(c.train.y, minlength=K).double()
        test_h = torch.bincount(c.test.y, minlength=K).double()
        torch.testing.assert_close(test_h / test_h.sum(), train_h / train_h.sum(), atol=0.05, rtol=0)
        assert len(c.test) > 0


def test_data_scarcity_keeps_a_fraction_of_training_and_all_of_test():
    pool = make_pool(official_test=False)
    full = federate(pool, data_cfg({"num_clients": 6}), seed=1)
    scarce = federate(pool, data_cfg({"num_clients": 6, "train_fraction": 0.25}), seed=1)
    for a, b in zip(full.clients, scarce.clients):
        assert len(b.train) == int(0.25 * len(a.train)) and ids(b.train) <= ids(a.train)
        assert torch.equal(a.test.x, b.test.x)
    capped = federate(pool, data_cfg({"num_clients": 6, "max_client_train": 7}), seed=1)
    assert max(len(c.train) for c in capped.clients) == 7


def test_target_as_partition_and_as_a_given_distribution():
    pool = make_pool(n_per_class=60)
    fd = federate(pool, data_cfg({"num_clients": 9, "partition.name": "classes", "partition.classes_per_client": 2,
                                  "partition.class_assignment": "random", "target.distribution": "partition"}), seed=0)
    t = fd.target
    assert len(fd.clients) == 9 and (t.distribution > 0).sum() == 2
    assert set(t.test.y.tolist()) == set(torch.nonzero(t.distribution).flatten().tolist())
    assert not ids(t.val) & set().union(*(ids(c.train) | ids(c.test) for c in fd.clients))
    want = [0.5, 0.5] + [0.0] * 8
    fd = federate(pool, data_cfg({"num_clients": 4, "target.distribution": want, "target.val_size": 10}), seed=0)
    # validation and test both come from the official test split (20 per class), disjoint
    assert torch.equal(torch.bincount(fd.target.val.y, minlength=K)[:3], torch.tensor([5, 5, 0]))
    assert torch.equal(torch.bincount(fd.target.test.y, minlength=K)[:3], torch.tensor([15, 15, 0]))
    assert not ids(fd.target.val) & ids(fd.target.test)
    assert sum(len(c.train) + len(c.test) for c in fd.clients) == len(pool.train)  # no training data taken
    for bad in ([0.5, 0.5], [1.5, -0.5] + [0.0] * 8, "someone"):
        with pytest.raises(ConfigError, match="data.target"):
            federate(pool, data_cfg({"num_clients": 4, "target.distribution": bad}), seed=0)


def test_pool_splits_merges_official_test_before_partitioning():
    pool = make_pool(n_per_class=30)
    fd = federate(pool, data_cfg({"num_clients": 4, "pool_splits": True, "test_fraction": 0.3}), seed=0)
    total = sum(len(c.train) + len(c.test) for c in fd.clients)
    assert total == len(pool.train) + len(pool.test) and fd.global_test is None


def test_oracle_clients_follow_the_target_and_keep_their_sizes():
    pool = make_pool(n_per_class=100)
    # round robin over 9 clients + target with C=2: every class is held by two partitions, so the target's
    # classes also exist outside its own data
    d = {"num_clients": 9, "partition.name": "classes", "partition.classes_per_client": 2,
         "partition.class_assignment": "round_robin", "target.distribution": "partition"}
    plain = federate(pool, data_cfg(d), seed=0)
    oracle = federate(pool, data_cfg({**d, "target.clients_follow": True}), seed=0)
    t = oracle.target.distribution
    assert torch.equal(t, plain.target.distribution)
    seen, ratios = set(), []
    for a, b in zip(plain.clients, oracle.clients):
        h = torch.bincount(torch.cat([b.train.y, b.test.y]), minlength=K).double()
        torch.testing.assert_close(h / h.sum(), t, atol=0.02, rtol=0)
        ratios.append((len(b.train) + len(b.test)) / (len(a.train) + len(a.test)))
        assert not (ids(b.train) | ids(b.test)) & seen
        seen |= ids(b.train) | ids(b.test)
    # sizes keep their proportions, scaled down together when the target's classes run short
    assert max(ratios) - min(ratios) < 0.15 and max(ratios) <= 1.0


def test_held_out_target_domain_with_dropped_labels_and_a_small_client():
    """FedPALS' PACS protocol: a held-out target domain, client k loses label k, client 2 keeps 10%."""
    pool = make_pool(n_per_class=40, domains=3)
    d = data_cfg({"num_clients": 3, "partition.name": "iid", "target.domain": "d2", "target.drop_labels": [2],
                  "drop_labels": [[0], [1], [2]], "client_train_fraction": [1.0, 1.0, 0.1]})
    fd = federate(pool, d, seed=0)
    for k, c in enumerate(fd.clients):
        assert k not in c.train.y.tolist() and k not in c.test.y.tolist()
        assert set(c.train.domain.tolist()) <= {0, 1}  # the target domain never reaches a client
    full = federate(pool, data_cfg({"num_clients": 3, "partition.name": "iid", "target.domain": "d2",
                                    "target.drop_labels": [2], "drop_labels": [[0], [1], [2]]}), seed=0)
    assert len(fd.clients[2].train) == int(0.1 * len(full.clients[2].train))
    t = fd.target
    assert set(t.test.domain.tolist()) == {2} and set(t.val.domain.tolist()) == {0, 1}
    assert 2 not in t.test.y.tolist() and 2 not in t.val.y.tolist() and float(t.distribution[2]) == 0
    assert len(t.test) == 9 * (40 + 13)  # every sample of the target domain but label 2, both splits
    with pytest.raises(ConfigError, match="data.target.domain"):
        federate(pool, data_cfg({"num_clients": 3, "partition.name": "iid", "target.domain": "d9"}), seed=0)
    with pytest.raises(ConfigError, match="data.drop_labels"):
        federate(pool, data_cfg({"num_clients": 3, "partition.name": "iid", "drop_labels": [[0]]}), seed=0)
