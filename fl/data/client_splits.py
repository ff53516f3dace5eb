"""The pipeline's stage after the partition: each client's positions become its train, test and validation splits
(data.test_split, test_fraction, train_fraction / client_train_fraction, max_client_train, val_fraction)."""
from __future__ import annotations

import numpy as np
import torch
from omegaconf import DictConfig

from fl.config import ConfigError
from fl.core import ClientData
from fl.core.sampling import proportional_sample, split_train_test, subsample
from fl.core.seeding import data_stream
from fl.data.held_out import HeldOut


def split_clients(parts: list[np.ndarray], h: HeldOut, d: DictConfig,
                  seed: int) -> tuple[list[ClientData], list[np.ndarray]]:
    """Each client's (train, test, val) splits from its positions in `h.source`, and the index lists they took (for
    the partition fingerprint). Refuses a setting that leaves every training client without training data."""
    fractions, new = _train_fractions(d), d.new_clients
    if new.count >= d.num_clients:
        raise ConfigError(f"data.new_clients.count={new.count} leaves no client to train; it must be < "
                          f"data.num_clients={d.num_clients}")
    split_rng, scarce_rng = data_stream(seed, "client-split"), data_stream(seed, "scarcity")
    val_rng = data_stream(seed, "client-val")
    drawn, emptied = [], {}  # each client's positions; client -> what left it no training data
    for cid, part in enumerate(parts):
        if not len(part):
            emptied[cid] = ("data.drop_labels" if d.drop_labels is not None else
                            f"data.partition.name={d.partition.name}")
        if d.test_split == "client":
            train_pos, test_pos = split_train_test(part, d.test_fraction, split_rng)
            if len(part) and not len(train_pos):
                emptied[cid] = f"data.test_fraction={d.test_fraction:g}"
        else:
            train_pos, test_pos = part, None  # drawn below from the official test split
        train_pos = test_mix = subsample(train_pos, fractions[cid], scarce_rng, d.max_client_train)
        val_pos = None
        if d.val_fraction > 0:  # after the test mix is set, so the test sets do not depend on it
            kept = len(train_pos)
            train_pos, val_pos = split_train_test(train_pos, d.val_fraction, val_rng)
            if kept and not len(train_pos):
                emptied[cid] = f"data.val_fraction={d.val_fraction:g}"
        drawn.append((train_pos, test_pos, val_pos, test_mix))
    training = d.num_clients - new.count
    if all(cid in emptied for cid in range(training)):  # nothing would train: a StopIteration, or a silent no-op run
        causes = " and ".join(sorted({emptied[cid] for cid in range(training)}))
        raise ConfigError(f"{causes} leaves all {training} training clients with no training data (the largest "
                          f"client holds {max(len(p) for p in parts)} samples); lower it or give the clients more "
                          "samples")
    test_rng, keys, official_keys = data_stream(seed, "client-test"), h.keys, h.official_keys
    num_keys = int(max(keys.max(), -1 if official_keys is None else official_keys.max())) + 1
    clients, index_lists = [], []
    for train_pos, test_pos, val_pos, test_mix in drawn:
        test_split, test_rows = h.source, None
        if test_pos is None:  # this client's (domain, label) mix, before its validation split
            want = np.bincount(keys[test_mix], minlength=num_keys).astype(float)
            test_pos, test_split = proportional_sample(official_keys, want, test_rng), h.official
            test_rows = torch.from_numpy(test_pos)  # rows of the global test set (federate: global_test=h.official)
        train = h.source.subset(torch.from_numpy(train_pos))
        val = None if val_pos is None else h.source.subset(torch.from_numpy(val_pos))
        dom = int(torch.mode(train.domain).values) if train.domain is not None else 0
        clients.append(ClientData(train, test_split.subset(torch.from_numpy(test_pos)), dom, val, test_rows))
        index_lists += [train_pos, test_pos] + ([val_pos] if val_pos is not None else [])
    return clients, index_lists


def _train_fractions(d: DictConfig) -> list[float]:
    """Each client's share of its training set that it keeps: data.train_fraction, or its entry of
    data.client_train_fraction."""
    if d.client_train_fraction is None:
        return [d.train_fraction] * d.num_clients
    values = list(d.client_train_fraction)
    if len(values) != d.num_clients:
        raise ConfigError(f"data.client_train_fraction needs one entry per client ({d.num_clients}); got "
                          f"{len(values)}")
    fractions = []
    for cid, value in enumerate(values):
        try:
            fractions.append(float(value))
        except (TypeError, ValueError):
            raise ConfigError(f"data.client_train_fraction[{cid}]={value!r} is not a number; give one share in (0, 1] "
                              "per client, e.g. [0.5, 1.0, ...]") from None
        if not 0 < fractions[-1] <= 1:
            raise ConfigError(f"data.client_train_fraction[{cid}]={value:g} must be in (0, 1]: the share of client "
                              f"{cid}'s training set it keeps")
    return fractions
