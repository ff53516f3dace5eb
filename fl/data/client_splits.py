"""The pipeline's stage after the partition: each client's positions become its train, test and validation splits
(data.test_split, test_fraction, train_fraction / client_train_fraction, max_client_train, val_fraction)."""
from __future__ import annotations

import numpy as np
import torch
from omegaconf import DictConfig

from fl.config import ConfigError
from fl.core import ClientData
from fl.data.held_out import HeldOut, proportional_sample, sample_keys, stream


def split_train_test(positions: np.ndarray, test_fraction: float, rng: np.random.Generator):
    """A client's own test split follows its own distribution: shuffle, then hold out a fraction."""
    perm = rng.permutation(positions)
    n_test = max(1, int(round(len(perm) * test_fraction))) if len(perm) > 1 else 0
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def subsample(positions: np.ndarray, fraction: float, rng: np.random.Generator, cap=None) -> np.ndarray:
    """Data scarcity (pFedFDA): keep int(fraction * n) training samples, drawn without replacement,
    and at most `cap` of them."""
    keep = int(fraction * len(positions)) if fraction < 1 else len(positions)
    keep = min(keep, cap) if cap is not None else keep
    if keep >= len(positions):
        return positions
    return np.sort(rng.choice(positions, size=max(keep, 1), replace=False))


def per_client(values, num_clients: int, key: str) -> list:
    """A per-client list setting, checked to hold one entry per client."""
    values = list(values)
    if len(values) != num_clients:
        raise ConfigError(f"{key} needs one entry per client ({num_clients}); got {len(values)}")
    return values


def split_clients(parts: list[np.ndarray], h: HeldOut, d: DictConfig, num_classes: int,
                  seed: int) -> tuple[list[ClientData], list[np.ndarray]]:
    """Each client's (train, test, val) splits from its positions in `h.source`, and the index lists they took (for
    the partition fingerprint). Refuses a setting that leaves every training client without training data."""
    source, official, keys = h.source, h.official, h.keys
    clients, index_lists = [], []
    split_rng, scarce_rng = stream(seed, "client-split"), stream(seed, "scarcity")
    test_rng, val_rng = stream(seed, "client-test"), stream(seed, "client-val")
    off_keys = None if official is None else sample_keys(official, num_classes)
    num_keys = int(max(keys.max(), -1 if off_keys is None else off_keys.max())) + 1
    emptied: dict[int, str] = {}  # client -> what left it no training data
    for cid, part in enumerate(parts):
        if not len(part):
            emptied[cid] = ("data.drop_labels" if d.drop_labels is not None else
                            f"data.partition.name={d.partition.name}")
        if d.test_split == "client":
            train_pos, test_pos = split_train_test(part, d.test_fraction, split_rng)
            test = source.subset(torch.from_numpy(test_pos))
            if len(part) and not len(train_pos):
                emptied[cid] = f"data.test_fraction={d.test_fraction:g}"
        else:
            train_pos, test_pos = part, None
        fraction = d.train_fraction if d.client_train_fraction is None else _fraction_of(d, cid)
        if not 0 < fraction <= 1:
            raise ConfigError(f"data.client_train_fraction[{cid}]={fraction:g} must be in (0, 1]: the share of client "
                              f"{cid}'s training set it keeps")
        train_pos = subsample(train_pos, fraction, scarce_rng, d.max_client_train)
        if test_pos is None:  # drawn from the official test split with this client's (domain, label) mix
            want = np.bincount(keys[train_pos], minlength=num_keys).astype(float)
            test_pos = proportional_sample(off_keys, want, test_rng)
            test = official.subset(torch.from_numpy(test_pos))
        val = None
        if d.val_fraction > 0:  # after the test mix is set, so the test sets do not depend on it
            kept = len(train_pos)
            train_pos, val_pos = split_train_test(train_pos, d.val_fraction, val_rng)
            val = source.subset(torch.from_numpy(val_pos))
            if kept and not len(train_pos):
                emptied[cid] = f"data.val_fraction={d.val_fraction:g}"
        train = source.subset(torch.from_numpy(train_pos))
        dom = int(torch.mode(train.domain).values) if train.domain is not None else 0
        clients.append(ClientData(train, test, dom, val))
        index_lists += [train_pos, test_pos] + ([val_pos] if val is not None else [])
    new = d.new_clients
    if new.count >= d.num_clients:
        raise ConfigError(f"data.new_clients.count={new.count} leaves no client to train; it must be < "
                          f"data.num_clients={d.num_clients}")
    training = d.num_clients - new.count
    if all(cid in emptied for cid in range(training)):  # nothing would train: a StopIteration, or a silent no-op run
        causes = " and ".join(sorted({emptied[cid] for cid in range(training)}))
        raise ConfigError(f"{causes} leaves all {training} training clients with no training data (the largest "
                          f"client holds {max(len(p) for p in parts)} samples); lower it or give the clients more "
                          "samples")
    return clients, index_lists


def _fraction_of(d: DictConfig, cid: int) -> float:
    """Client cid's entry of data.client_train_fraction, as a number."""
    value = per_client(d.client_train_fraction, d.num_clients, "data.client_train_fraction")[cid]
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"data.client_train_fraction[{cid}]={value!r} is not a number; give one share in (0, 1] "
                          "per client, e.g. [0.5, 1.0, ...]") from None
