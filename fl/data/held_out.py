"""The pipeline's first stage after loading: what the clients never see. The pool's source and test splits
(data.pool_splits), a held-out test split when the pool has none, the public set (data.public_size) and the target
client's distribution and validation data (data.target). Every draw comes from the partition seed, one stream per
purpose, so switching one option (say, a public set) does not reshuffle the others."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from omegaconf import DictConfig

from fl.config import ConfigError
from fl.core import Split, Target
from fl.core.sampling import proportional_sample
from fl.core.seeding import data_stream
from fl.data.base import Pool


def sample_keys(split: Split, num_classes: int) -> np.ndarray:
    """(domain, label) as one key, so matched test sets follow both the domain and the label mix."""
    y = split.y.numpy()
    return y if split.domain is None else split.domain.numpy() * num_classes + y


def parse_target(target, num_classes: int) -> Optional[np.ndarray]:
    """`data.target.distribution`: null, "partition" (one more partition made like the clients'), or K
    probabilities ("test" is resolved by `hold_out`, which has the test split)."""
    if target is None or target == "partition":
        return None
    try:
        t = np.asarray(list(target), dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(f"data.target.distribution={target!r} must be null, 'partition', 'test' or a list of "
                          f"{num_classes} probabilities") from None
    if t.shape != (num_classes,) or not np.isfinite(t).all() or (t < 0).any() or abs(t.sum() - 1) > 1e-6:
        raise ConfigError(f"data.target.distribution must have {num_classes} non-negative entries summing to 1; "
                          f"got {len(t)} entries summing to {t.sum():.4g}")
    return t


@dataclass
class HeldOut:
    """The pool once the sets the clients never see are taken out. `free` marks the source positions left for
    the clients; `fine` holds the source's fine labels (data.partition.labels=fine) when the dataset has them."""
    num_classes: int
    source: Split
    official: Optional[Split]  # the test split every client test set and the global test set come from
    free: np.ndarray
    keys: np.ndarray  # sample_keys(source)
    official_keys: Optional[np.ndarray]  # sample_keys(official)
    fine: Optional[torch.Tensor]
    public: Optional[Split] = None
    public_pos: Optional[np.ndarray] = None
    target_dist: Optional[np.ndarray] = None
    domain_target: Optional[Target] = None  # a held-out domain as the target (data.target.domain)
    target_val: Optional[np.ndarray] = None  # positions of the target's validation set in the official split
    target_taken: Optional[np.ndarray] = None  # official positions the target's validation set took


def hold_out(pool: Pool, d: DictConfig, seed: int) -> HeldOut:
    K = pool.num_classes
    source, official = pool.train, pool.test
    if d.target.distribution == "test":  # the official test split's label marginal (FedPALS' iWildCam)
        if official is None:
            raise ConfigError(f"data.target.distribution=test needs a dataset with a test split; data.name={d.name!r} "
                              "has none")
        counts = np.bincount(official.y.numpy(), minlength=K).astype(np.float64)
        target_dist = counts / counts.sum()
    else:
        target_dist = parse_target(d.target.distribution, K)
    fine = pool.fine_labels
    if d.pool_splits and official is None:
        raise ConfigError(f"data.pool_splits=true merges the official train and test splits; data.name={d.name!r} "
                          "has no test split (use false)")
    _check_label_lists(d, K)
    if d.pool_splits:  # FedDRM partitions the pooled train+test data
        source, official = Split.cat([pool.train, official]), None
        fine = None if fine is None else torch.cat(list(fine))
    elif fine is not None:
        fine = fine[0]
    domain_target = None
    if d.target.domain is not None:  # a held-out domain is the target (FedPALS' PACS protocol)
        source, official, domain_target = _hold_out_target_domain(pool, source, official, d)
        target_dist = domain_target.distribution.numpy()
    need_official = d.test_split == "official" or d.target.distribution is not None
    n = len(source)
    free = np.ones(n, dtype=bool)
    keys = sample_keys(source, K)
    official_keys = None if official is None else sample_keys(official, K)
    if official is None and need_official:  # hold out a stratified test split of the pool
        held = proportional_sample(keys, np.bincount(keys).astype(float), data_stream(seed, "heldout-test"),
                                   size=int(round(d.test_fraction * n)))
        official, official_keys, free[held] = source.subset(torch.from_numpy(held)), keys[held], False
    h = HeldOut(K, source, official, free, keys, official_keys, fine, target_dist=target_dist,
                domain_target=domain_target)

    if d.public_size:  # held out from every client, class-balanced; its labels are for diagnostics only
        if d.public_size >= int(free.sum()):  # the clients need samples too
            raise ConfigError(f"data.public_size={d.public_size} leaves no samples for the clients: the pool has "
                              f"{int(free.sum())} after the held-out test split; use fewer")
        h.public_pos = proportional_sample(source.y.numpy(), np.ones(K), data_stream(seed, "public"), free,
                                           size=d.public_size)
        h.public, free[h.public_pos] = source.subset(torch.from_numpy(h.public_pos)), False

    if target_dist is not None and domain_target is None:  # validation from the official test split, disjoint
        # from the target test
        h.target_val = proportional_sample(official.y.numpy(), target_dist, data_stream(seed, "target"),
                                           size=d.target.val_size)
        h.target_taken = np.zeros(len(official), dtype=bool)
        h.target_taken[h.target_val] = True
    return h


def _check_label_lists(d: DictConfig, num_classes: int) -> None:
    """data.drop_labels (one list per client) and data.target.drop_labels name labels in [0, K) and leave some
    label."""
    if d.drop_labels is not None and len(d.drop_labels) != d.num_clients:
        raise ConfigError(f"data.drop_labels needs one entry per client ({d.num_clients}); got {len(d.drop_labels)}")
    lists = [(f"data.drop_labels[{i}]", drop) for i, drop in enumerate(d.drop_labels or [])]
    lists.append(("data.target.drop_labels", d.target.drop_labels))
    for key, drop in lists:
        labels = [drop] if isinstance(drop, int) else list(drop or [])
        bad = [k for k in labels if not isinstance(k, int) or not 0 <= k < num_classes]
        if bad:
            raise ConfigError(f"{key}={labels} holds {bad[0]!r}, not a label of {d.name!r} (0..{num_classes - 1})")
        if len(set(labels)) >= num_classes:
            raise ConfigError(f"{key} drops all {num_classes} labels; at least one must stay")


def _hold_out_target_domain(pool: Pool, source: Split, official: Optional[Split], d: DictConfig):
    """Remove `data.target.domain` from the clients' pool. Its samples (both splits), without
    `data.target.drop_labels`, are the target test set; the source domains' test split, without those
    labels, is the target validation set; T is the target test's label mix."""
    if d.target.domain not in pool.domain_names:
        raise ConfigError(f"data.target.domain={d.target.domain!r} is not a domain of {d.name!r}; choices: "
                          f"{', '.join(pool.domain_names) or 'none (the dataset has no domains)'}")
    if official is None or d.target.distribution is not None:
        raise ConfigError("data.target.domain needs a dataset with a test split and data.target.distribution=null")
    dom = pool.domain_names.index(d.target.domain)
    drop = torch.tensor(list(d.target.drop_labels), dtype=torch.int64)
    keep = lambda split, mask: split.subset(torch.nonzero(mask & ~torch.isin(split.y, drop)).flatten())  # noqa: E731
    test = Split.cat([keep(source, source.domain == dom), keep(official, official.domain == dom)])
    val = keep(official, official.domain != dom)
    source = source.subset(torch.nonzero(source.domain != dom).flatten())
    official = official.subset(torch.nonzero(official.domain != dom).flatten())
    dist = torch.bincount(test.y, minlength=pool.num_classes).double()
    return source, official, Target(dist / dist.sum(), val, test)
