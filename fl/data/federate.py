"""From a loaded Pool to FederatedData: public set, target, client partition, per-client train/test,
scarcity, covariate transforms. Every draw comes from the run's partition seed, one stream per purpose,
so switching one option (say, a public set) does not reshuffle the others."""
from __future__ import annotations

import functools
from typing import Optional

import numpy as np
import torch
from omegaconf import DictConfig

from fl.config import ConfigError
from fl.core import ClientData, FederatedData, Split, Target, derive_seed
from fl.core.federated_data import images
from fl.data import partition as P
from fl.data.base import Pool
from fl.data.transforms import CLIENT_TRANSFORMS, corrupt, feddrm_color_by_owner, frost_dir_default


def _rng(seed: int, purpose: str) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, 0, -1, purpose))


def _keys(split: Split, num_classes: int) -> np.ndarray:
    """(domain, label) as one key, so matched test sets follow both the domain and the label mix."""
    y = split.y.numpy()
    return y if split.domain is None else split.domain.numpy() * num_classes + y


def parse_target(target, num_classes: int) -> Optional[np.ndarray]:
    """`data.target.distribution`: null, "partition" (one more partition made like the clients'), or K
    probabilities ("test" is resolved by federate, which has the test split)."""
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


def proportional_sample(keys: np.ndarray, want: np.ndarray, rng: np.random.Generator,
                        allowed: Optional[np.ndarray] = None, size: Optional[int] = None) -> np.ndarray:
    """Positions whose key histogram is proportional to `want` (a weight per key), as many as the scarcest
    key allows (or `size` in total), sampled without replacement."""
    allowed = np.ones(len(keys), dtype=bool) if allowed is None else allowed
    have = np.bincount(keys[allowed], minlength=len(want))[:len(want)]
    use = (want > 0) & (have > 0)
    if not use.any():
        return np.zeros(0, dtype=np.int64)
    scale = (have[use] / want[use]).min() if size is None else size / want[use].sum()
    counts = np.minimum(np.round(want * scale).astype(int), have) * use
    out = [rng.choice(np.flatnonzero((keys == k) & allowed), size=c, replace=False)
           for k, c in enumerate(counts) if c > 0]
    return np.sort(np.concatenate(out)) if out else np.zeros(0, dtype=np.int64)


def partition_positions(labels: np.ndarray, domains: Optional[np.ndarray], d: DictConfig, num_parts: int,
                        rng: np.random.Generator) -> list[np.ndarray]:
    """Positions (into `labels`) of each client under `data.partition`."""
    p = d.partition
    if p.name == "iid":
        return P.iid(len(labels), num_parts, rng)
    if p.name == "dirichlet":
        return P.dirichlet(labels, num_parts, p.alpha, rng, p.min_client_size, p.balance)
    if p.name == "dirichlet_per_client":
        size = p.samples_per_client or len(labels) // num_parts
        return P.dirichlet_per_client(labels, num_parts, p.alpha, rng, size)
    if p.name == "classes":
        return P.classes(labels, num_parts, p.classes_per_client, rng, p.class_assignment)
    if p.name == "domain_groups":  # whole domains, shuffled and dealt round-robin (Bai et al.'s iWildCam split)
        if domains is None:
            raise ConfigError(f"data.partition.name=domain_groups needs a dataset with domains; data.name={d.name!r} "
                              "has none")
        doms = rng.permutation(np.unique(domains))
        if len(doms) < num_parts:
            raise ConfigError(f"data.partition.name=domain_groups deals whole domains to clients: data.num_clients="
                              f"{num_parts} exceeds the {len(doms)} domains of data.name={d.name!r}")
        return [np.flatnonzero(np.isin(domains, doms[c::num_parts])) for c in range(num_parts)]
    if p.name == "shards":
        return P.shards(labels, num_parts, p.shards_per_client, rng)
    # domains: clients_per_domain clients per domain, with `within_domain` skew inside each domain
    if domains is None:
        raise ConfigError(f"data.partition.name=domains needs a dataset with domains; data.name={d.name!r} has none")
    parts = []
    for dom in np.unique(domains):
        where = np.flatnonzero(domains == dom)
        sub = P.iid(len(where), p.clients_per_domain, rng) if p.within_domain == "iid" else (
            P.classes(labels[where], p.clients_per_domain, p.classes_per_client, rng, p.class_assignment)
            if p.within_domain == "classes" else
            P.dirichlet(labels[where], p.clients_per_domain, p.alpha, rng, p.min_client_size,
                        p.balance))
        parts += [where[s] for s in sub]
    if num_parts != len(parts):
        raise ConfigError(f"data.num_clients={num_parts} must equal the number of domains x "
                          f"data.partition.clients_per_domain = {len(parts)} for data.partition.name=domains")
    return parts


def federate(pool: Pool, d: DictConfig, seed: int) -> FederatedData:
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
    keys = _keys(source, K)
    if official is None and need_official:  # hold out a stratified test split of the pool
        held = proportional_sample(keys, np.bincount(keys).astype(float), _rng(seed, "heldout-test"),
                                   size=int(round(d.test_fraction * n)))
        official, free[held] = source.subset(torch.from_numpy(held)), False

    public, public_pos = None, None
    if d.public_size:  # held out from every client, class-balanced; its labels are for diagnostics only
        if d.public_size >= int(free.sum()):  # the clients need samples too
            raise ConfigError(f"data.public_size={d.public_size} leaves no samples for the clients: the pool has "
                              f"{int(free.sum())} after the held-out test split; use fewer")
        public_pos = proportional_sample(source.y.numpy(), np.ones(K), _rng(seed, "public"), free,
                                         size=d.public_size)
        public, free[public_pos] = source.subset(torch.from_numpy(public_pos)), False

    target_val = target_taken = None
    if target_dist is not None and domain_target is None:  # validation from the official test split, disjoint
        # from the target test
        target_val = proportional_sample(official.y.numpy(), target_dist, _rng(seed, "target"),
                                        size=d.target.val_size)
        target_taken = np.zeros(len(official), dtype=bool)
        target_taken[target_val] = True

    if d.partition.labels == "fine" and fine is None:
        raise ConfigError(f"data.partition.labels=fine needs a dataset with fine labels (cifar20); "
                          f"data.name={d.name!r} has none")
    avail = np.flatnonzero(free)
    labels = (fine if d.partition.labels == "fine" else source.y).numpy()[avail]
    domains = None if source.domain is None else source.domain.numpy()[avail]
    num_parts = d.num_clients + (1 if d.target.distribution == "partition" else 0)
    parts = [avail[p] for p in partition_positions(labels, domains, d, num_parts, _rng(seed, "partition"))]
    if d.drop_labels is not None:  # per-client labels removed (FedPALS' PACS: client k loses label k)
        drops = _per_client(d.drop_labels, d.num_clients, "data.drop_labels")
        y_all = source.y.numpy()
        parts = [p[~np.isin(y_all[p], np.atleast_1d(drop))] if i < len(drops) else p
                 for i, (p, drop) in enumerate(zip(parts, drops + [[]] * (len(parts) - len(drops))))]
    val_split = official
    if d.target.distribution == "partition":  # the extra partition is the target; its samples are its validation set
        target_val, val_split = parts.pop(), source
        target_dist = np.bincount(source.y.numpy()[target_val], minlength=K) / len(target_val)
    if d.target.clients_follow:  # FedPALS' Oracle: every client's data redrawn with the target's label mix
        usable = free.copy()
        if val_split is source:
            usable[target_val] = False
        parts = _follow_target(parts, source.y.numpy(), usable, target_dist, _rng(seed, "oracle"))

    clients, index_lists = [], []
    split_rng, scarce_rng, test_rng = _rng(seed, "client-split"), _rng(seed, "scarcity"), _rng(seed, "client-test")
    val_rng = _rng(seed, "client-val")
    off_keys = None if official is None else _keys(official, K)
    num_keys = int(max(keys.max(), -1 if off_keys is None else off_keys.max())) + 1
    emptied: dict[int, str] = {}  # client -> what left it no training data
    for cid, part in enumerate(parts):
        if not len(part):
            emptied[cid] = ("data.drop_labels" if d.drop_labels is not None else
                            f"data.partition.name={d.partition.name}")
        if d.test_split == "client":
            train_pos, test_pos = P.split_train_test(part, d.test_fraction, split_rng)
            test = source.subset(torch.from_numpy(test_pos))
            if len(part) and not len(train_pos):
                emptied[cid] = f"data.test_fraction={d.test_fraction:g}"
        else:
            train_pos, test_pos = part, None
        fraction = d.train_fraction if d.client_train_fraction is None else _fraction_of(d, cid)
        if not 0 < fraction <= 1:
            raise ConfigError(f"data.client_train_fraction[{cid}]={fraction:g} must be in (0, 1]: the share of client "
                              f"{cid}'s training set it keeps")
        train_pos = P.subsample(train_pos, fraction, scarce_rng, d.max_client_train)
        if test_pos is None:  # drawn from the official test split with this client's (domain, label) mix
            want = np.bincount(keys[train_pos], minlength=num_keys).astype(float)
            test_pos = proportional_sample(off_keys, want, test_rng)
            test = official.subset(torch.from_numpy(test_pos))
        val = None
        if d.val_fraction > 0:  # after the test mix is set, so the test sets do not depend on it
            kept = len(train_pos)
            train_pos, val_pos = P.split_train_test(train_pos, d.val_fraction, val_rng)
            val = source.subset(torch.from_numpy(val_pos))
            if kept and not len(train_pos):
                emptied[cid] = f"data.val_fraction={d.val_fraction:g}"
        train = source.subset(torch.from_numpy(train_pos))
        dom = int(torch.mode(train.domain).values) if train.domain is not None else 0
        clients.append(ClientData(train, test, dom, val))
        index_lists += [train_pos, test_pos] + ([val_pos] if val is not None else [])

    batch_transform = _apply_client_transform(clients, d, seed) if d.client_transform != "none" else None
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
    if new.corruption != "none":  # Table 4: every image of the new clients, train and test alike
        for cid in range(d.num_clients - new.count, d.num_clients):
            c = clients[cid]
            gen = torch.Generator().manual_seed(derive_seed(seed, 0, cid, "new-client-corruption"))
            _transform_splits(_splits(c), functools.partial(corrupt, name=new.corruption, severity=new.severity,
                                                            gen=gen, frost_dir=frost_dir_default()))
    target = domain_target
    if target_dist is not None and target is None:
        allowed = None if target_taken is None else ~target_taken
        test_pos = proportional_sample(official.y.numpy(), target_dist, _rng(seed, "target-test"), allowed)
        target = Target(torch.from_numpy(target_dist), val_split.subset(torch.from_numpy(target_val)),
                        official.subset(torch.from_numpy(test_pos)))
        index_lists += [target_val, test_pos]
    if public_pos is not None:
        index_lists.append(public_pos)
    global_test = official  # the dataset's own (or held-out) test set: the global model's pooled test
    return FederatedData(pool.name, K, tuple(source.x.shape[1:]), clients,
                         partition=[torch.from_numpy(np.asarray(i, dtype=np.int64)) for i in index_lists],
                         global_test=global_test, public=public, target=target, mean=pool.mean, std=pool.std,
                         class_names=pool.class_names, domain_names=pool.domain_names, num_new_clients=new.count,
                         batch_transform=batch_transform)


def _check_label_lists(d: DictConfig, num_classes: int) -> None:
    """data.drop_labels (per client) and data.target.drop_labels name labels in [0, K) and leave some label."""
    lists = [(f"data.drop_labels[{i}]", drop) for i, drop in enumerate(d.drop_labels or [])]
    lists.append(("data.target.drop_labels", d.target.drop_labels))
    for key, drop in lists:
        labels = [drop] if isinstance(drop, int) else list(drop or [])
        bad = [k for k in labels if not isinstance(k, int) or not 0 <= k < num_classes]
        if bad:
            raise ConfigError(f"{key}={labels} holds {bad[0]!r}, not a label of {d.name!r} (0..{num_classes - 1})")
        if len(set(labels)) >= num_classes:
            raise ConfigError(f"{key} drops all {num_classes} labels; at least one must stay")


def _fraction_of(d: DictConfig, cid: int) -> float:
    """Client cid's entry of data.client_train_fraction, as a number."""
    value = _per_client(d.client_train_fraction, d.num_clients, "data.client_train_fraction")[cid]
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"data.client_train_fraction[{cid}]={value!r} is not a number; give one share in (0, 1] "
                          "per client, e.g. [0.5, 1.0, ...]") from None


def _per_client(values, num_clients: int, key: str) -> list:
    values = list(values)
    if len(values) != num_clients:
        raise ConfigError(f"{key} needs one entry per client ({num_clients}); got {len(values)}")
    return values


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
        raise ConfigError("data.clients_follow_target: the pool outside the target's own data holds too few samples "
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


def _apply_client_transform(clients: list[ClientData], d: DictConfig, seed: int):
    """Per-client covariate shift (FedDRM colour transforms, pFedFDA CIFAR-S corruptions) of both the
    client's train and test data: each client's test set follows its own distribution. Applied once to the
    stored images, or, with `data.client_transform_after_augment`, to each batch after its augmentation;
    then the batch transform is returned (test images not augmented at evaluation are still shifted once:
    the same images)."""
    fn = CLIENT_TRANSFORMS[d.client_transform]
    if d.client_transform_level != "auto" and d.client_transform != "feddrm_color":
        raise ConfigError(f"data.client_transform_level={d.client_transform_level!r} sets FedDRM's colour-shift "
                          f"intensity; data.client_transform={d.client_transform!r} has no levels")
    per_batch = d.client_transform_after_augment
    if per_batch and d.client_transform != "feddrm_color":
        raise ConfigError(f"data.client_transform_after_augment=true re-applies the transform to every batch, so it "
                          f"needs a deterministic one (feddrm_color); data.client_transform={d.client_transform!r} "
                          "draws random corruptions")
    if per_batch and d.new_clients.corruption != "none":
        raise ConfigError("data.new_clients.corruption corrupts the stored images, which must come after the client "
                          "transform: use it with data.client_transform_after_augment=false")
    num_clients, level = len(clients), d.client_transform_level
    for cid, c in enumerate(clients):
        if c.train.x.dtype != torch.uint8 or c.train.x.dim() != 4 or c.train.x.shape[1] != 3:  # colour shifts
            raise ConfigError(f"data.client_transform={d.client_transform!r} needs uint8 RGB images [N, 3, H, W]; "
                              f"data.name={d.name!r} gives {c.train.x.dtype} {list(c.train.x.shape[1:])}")
        shift = functools.partial(fn, client=cid, num_clients=num_clients, seed=seed, level=level)
        if per_batch:  # training batches are shifted after their crop; evaluation batches are not cropped
            evaluated = [s for s in _splits(c) if s is not c.train]
            for split in [c.train] + (evaluated if d.eval_augment else []):
                split.owner = torch.full((len(split),), cid, dtype=torch.int64)
            if not d.eval_augment:
                _transform_splits(evaluated, shift)
            continue
        # one call on all splits together: random corruptions (noise, blur angle) then differ per image
        _transform_splits(_splits(c), shift)
    if per_batch:  # (batch, owners) -> batch, on the batch's device
        return functools.partial(feddrm_color_by_owner, num_clients=num_clients, level=level)
    return None


def _splits(c: ClientData) -> list[Split]:
    return [c.train, c.test] + ([c.val] if c.val is not None else [])


def _transform_splits(splits: list[Split], fn) -> None:
    """fn applied once to the images of `splits` together, written back split by split (in memory: a transformed
    image is no longer the cached one)."""
    out = fn(torch.cat([images(s.x) for s in splits]))
    for split, part in zip(splits, out.split([len(s) for s in splits])):
        split.x = part
