"""From a loaded Pool to FederatedData, a short pipeline: hold out what the clients never see (fl/data/held_out.py),
partition the rest (the registered data.partition), split each client's part (fl/data/client_splits.py), then
transform each client's images (the registered data.client_transform). Every draw comes from the run's partition
seed, one stream per purpose, so switching one option (say, a public set) does not reshuffle the others."""
from __future__ import annotations

import functools
from typing import Optional

import numpy as np
import torch
from omegaconf import DictConfig

from fl.config import ConfigError
from fl.core import ClientData, FederatedData, Split, Target, derive_seed
from fl.core.federated_data import images
from fl.core.registry import CLIENT_TRANSFORMS, PARTITIONS
from fl.data.base import Candidates, Pool
from fl.data.client_splits import per_client, split_clients
from fl.data.held_out import HeldOut, hold_out, proportional_sample, stream
from fl.data.transforms import corrupt, frost_dir_default


def federate(pool: Pool, d: DictConfig, seed: int) -> FederatedData:
    K = pool.num_classes
    h = hold_out(pool, d, seed)
    parts = partition(h, d, seed)
    val_split = h.official
    if d.target.distribution == "partition":  # the extra partition is the target; its samples are its validation set
        h.target_val, val_split = parts.pop(), h.source
        h.target_dist = np.bincount(h.source.y.numpy()[h.target_val], minlength=K) / len(h.target_val)
    if d.target.clients_follow:  # FedPALS' Oracle: every client's data redrawn with the target's label mix
        usable = h.free.copy()
        if val_split is h.source:
            usable[h.target_val] = False
        parts = _follow_target(parts, h.source.y.numpy(), usable, h.target_dist, stream(seed, "oracle"))
    clients, index_lists = split_clients(parts, h, d, K, seed)
    batch_transform = transform_clients(clients, d, seed)
    new = d.new_clients
    if new.corruption != "none":  # pFedFDA Table 4: every image of the new clients, train and test alike
        for cid in range(d.num_clients - new.count, d.num_clients):
            gen = torch.Generator().manual_seed(derive_seed(seed, 0, cid, "new-client-corruption"))
            _transform_splits(_splits(clients[cid]), functools.partial(
                corrupt, name=new.corruption, severity=new.severity, gen=gen, frost_dir=frost_dir_default()))
    target = h.domain_target
    if h.target_dist is not None and target is None:
        allowed = None if h.target_taken is None else ~h.target_taken
        test_pos = proportional_sample(h.official.y.numpy(), h.target_dist, stream(seed, "target-test"), allowed)
        target = Target(torch.from_numpy(h.target_dist), val_split.subset(torch.from_numpy(h.target_val)),
                        h.official.subset(torch.from_numpy(test_pos)))
        index_lists += [h.target_val, test_pos]
    if h.public_pos is not None:
        index_lists.append(h.public_pos)
    return FederatedData(pool.name, K, tuple(h.source.x.shape[1:]), clients,
                         partition=[torch.from_numpy(np.asarray(i, dtype=np.int64)) for i in index_lists],
                         global_test=h.official,  # the dataset's own (or held-out) test set: the global model's
                         public=h.public, target=target, mean=pool.mean, std=pool.std,
                         class_names=pool.class_names, domain_names=pool.domain_names, num_new_clients=new.count,
                         batch_transform=batch_transform)


def partition(h: HeldOut, d: DictConfig, seed: int) -> list[np.ndarray]:
    """Each client's positions in `h.source` under the registered `data.partition` (one more part for a target
    made like the clients', data.target.distribution=partition), without its data.drop_labels."""
    if d.partition.labels == "fine" and h.fine is None:
        raise ConfigError(f"data.partition.labels=fine needs a dataset with fine labels (cifar20); "
                          f"data.name={d.name!r} has none")
    avail = np.flatnonzero(h.free)
    labels = (h.fine if d.partition.labels == "fine" else h.source.y).numpy()[avail]
    domains = None if h.source.domain is None else h.source.domain.numpy()[avail]
    num_parts = d.num_clients + (1 if d.target.distribution == "partition" else 0)
    scheme = PARTITIONS[d.partition.name].fn
    parts = [avail[p] for p in scheme(Candidates(labels, domains, d.name), num_parts, d.partition,
                                      stream(seed, "partition"))]
    if d.drop_labels is not None:  # per-client labels removed (FedPALS' PACS: client k loses label k)
        drops = per_client(d.drop_labels, d.num_clients, "data.drop_labels")
        y_all = h.source.y.numpy()
        parts = [p[~np.isin(y_all[p], np.atleast_1d(drop))] if i < len(drops) else p
                 for i, (p, drop) in enumerate(zip(parts, drops + [[]] * (len(parts) - len(drops))))]
    return parts


def transform_clients(clients: list[ClientData], d: DictConfig, seed: int):
    """The registered `data.client_transform` on each client's train, test and validation images (FedDRM's colour
    shifts, pFedFDA's CIFAR-S corruptions): once on the stored images, or, with `after_augment`, on each batch after
    its augmentation; then the batch transform is returned (test images not augmented at evaluation are still
    shifted once: the same images). None when there is no per-batch transform."""
    s = d.client_transform
    if s.name == "none":
        return None
    plugin = CLIENT_TRANSFORMS[s.name]
    if s.after_augment and plugin.batch is None:
        raise ConfigError(f"data.client_transform.after_augment=true re-applies the transform to every batch, so it "
                          f"needs one with a per-batch form (feddrm_color); data.client_transform.name={s.name!r} "
                          "has none")
    if s.after_augment and d.new_clients.corruption != "none":
        raise ConfigError("data.new_clients.corruption corrupts the stored images, which must come after the client "
                          "transform: use it with data.client_transform.after_augment=false")
    num_clients = len(clients)
    for cid, c in enumerate(clients):
        if c.train.x.dtype != torch.uint8 or c.train.x.dim() != 4 or c.train.x.shape[1] != 3:  # colour shifts
            raise ConfigError(f"data.client_transform.name={s.name!r} needs uint8 RGB images [N, 3, H, W]; "
                              f"data.name={d.name!r} gives {c.train.x.dtype} {list(c.train.x.shape[1:])}")
        shift = functools.partial(plugin.fn, client=cid, num_clients=num_clients, seed=seed, s=s)
        if s.after_augment:  # training batches are shifted after their crop; evaluation batches are not cropped
            evaluated = [split for split in _splits(c) if split is not c.train]
            for split in [c.train] + (evaluated if d.eval_augment else []):
                split.owner = torch.full((len(split),), cid, dtype=torch.int64)
            if not d.eval_augment:
                _transform_splits(evaluated, shift)
            continue
        # one call on all splits together: random corruptions (noise, blur angle) then differ per image
        _transform_splits(_splits(c), shift)
    if s.after_augment:  # (batch, owners) -> batch, on the batch's device
        return functools.partial(plugin.batch, num_clients=num_clients, s=s)
    return None


def _follow_target(parts: list[np.ndarray], labels: np.ndarray, avail: np.ndarray, target: Optional[np.ndarray],
                   rng: np.random.Generator) -> list[np.ndarray]:
    """Each client keeps its size n_i (scaled down if the pool runs short) but draws its samples from the
    whole usable pool, without replacement across clients, with the target's label proportions."""
    if target is None:
        raise ConfigError("data.target.clients_follow=true needs data.target.distribution or data.target.domain")
    have = np.bincount(labels[avail], minlength=len(target))
    sizes = np.array([len(p) for p in parts], dtype=float)
    need = target * sizes.sum()
    scale = min(1.0, min(have[k] / need[k] for k in np.flatnonzero(target > 0)))
    if scale * sizes.min() < 1:
        raise ConfigError("data.target.clients_follow: the pool outside the target's own data holds too few samples "
                          f"of the target's classes {np.flatnonzero(target > 0).tolist()} to give every client one")
    pools = {k: list(rng.permutation(np.flatnonzero(avail & (labels == k)))) for k in np.flatnonzero(target > 0)}
    out = []
    for size in sizes:  # floor per class, so the pool never runs out part-way
        pos = []
        for k, pool in pools.items():
            take = int(target[k] * size * scale)
            pos += pool[:take]
            del pool[:take]
        out.append(np.sort(np.array(pos, dtype=np.int64)))
    return out


def _splits(c: ClientData) -> list[Split]:
    return [c.train, c.test] + ([c.val] if c.val is not None else [])


def _transform_splits(splits: list[Split], fn) -> None:
    """fn applied once to the images of `splits` together, written back split by split (in memory: a transformed
    image is no longer the cached one)."""
    out = fn(torch.cat([images(s.x) for s in splits]))
    for split, part in zip(splits, out.split([len(s) for s in splits])):
        split.x = part
