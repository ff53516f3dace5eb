"""Seeded client partitions of a labelled pool, as the seed papers build them.

Every function takes the labels of the candidate samples (numpy int array) and a numpy Generator, and
returns one array of positions (into `labels`) per client. Impossible requests raise ConfigError naming
the key to change, never loop forever.
"""
from __future__ import annotations

import numpy as np

from fl.config import ConfigError


def iid(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    if num_clients > n:
        raise ConfigError(f"data.num_clients={num_clients} exceeds the {n} samples available (each client needs one)")
    return [np.sort(part) for part in np.array_split(rng.permutation(n), num_clients)]


def dirichlet(labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator, min_size: int = 10,
              balance: bool = False, max_tries: int = 1000) -> list[np.ndarray]:
    """Label skew (Yurochkin et al.; fedlab `hetero_dir_partition`): for each class, proportions over the
    clients ~ Dir(alpha); redrawn whole until every client holds at least `min_size` samples.
    `balance`: a client already holding N/M samples gets no more (fedlab's and pFedFDA's trick)."""
    n = len(labels)
    _check_enough(n, num_clients, min_size, "data.partition.min_client_size")
    classes = np.unique(labels)
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        sizes = np.zeros(num_clients, dtype=np.int64)
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            props = rng.dirichlet(np.full(num_clients, alpha))
            if balance:
                props = props * (sizes < n / num_clients)
                props = props / props.sum() if props.sum() > 0 else np.full(num_clients, 1 / num_clients)
            cuts = np.round(np.cumsum(props) * len(idx)).astype(int)[:-1]
            for client, chunk in enumerate(np.split(idx, cuts)):
                parts[client].append(chunk)
                sizes[client] += len(chunk)
        if sizes.min() >= min_size:
            return [np.sort(np.concatenate(client)) for client in parts]
    raise ConfigError(f"no Dirichlet(alpha={alpha}) split gave every one of {num_clients} clients >= {min_size} "
                      f"samples in {max_tries} draws; lower data.partition.min_client_size or raise "
                      "data.partition.alpha")


def dirichlet_per_client(labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator,
                         size: int) -> list[np.ndarray]:
    """FedPALS' per-client label skew: client i's label proportions p_i ~ Dir_K(alpha); it draws size * p_i(k)
    samples of class k without replacement (renormalising over the classes not yet exhausted)."""
    classes = np.unique(labels)
    _check_enough(len(labels), num_clients, size, "data.partition.samples_per_client")
    pools = {c: list(rng.permutation(np.flatnonzero(labels == c))) for c in classes}
    parts = []
    for _ in range(num_clients):
        want = np.round(rng.dirichlet(np.full(len(classes), alpha)) * size).astype(int)
        taken: list[int] = []
        deficit = 0
        for c, k in zip(classes, want):
            got = pools[c][:k]
            pools[c] = pools[c][k:]
            taken += got
            deficit += k - len(got)
        while deficit > 0:  # a class ran out: fill from the others in proportion to what is left
            left = np.array([len(pools[c]) for c in classes], dtype=float)
            if left.sum() == 0:
                break
            c = classes[rng.choice(len(classes), p=left / left.sum())]
            taken.append(pools[c].pop(0))
            deficit -= 1
        parts.append(np.sort(np.array(taken, dtype=np.int64)))
    return parts


def class_sets(num_clients: int, num_classes: int, per_client: int, rng: np.random.Generator,
               assignment: str) -> list[np.ndarray]:
    """Which classes each client holds.
    round_robin: clients take consecutive pairs (for C=2) of a random class permutation, so classes are
      used equally often and, when M*C = K, cover the classes disjointly (FedMosaic's hybrid split);
    random: NIID-Bench '#C=k' (FedPALS): client p holds class p mod K plus C-1 others drawn at random."""
    if per_client > num_classes:
        raise ConfigError(f"data.partition.classes_per_client={per_client} exceeds the {num_classes} classes available")
    if assignment == "round_robin":
        perm = rng.permutation(num_classes)
        return [np.sort(perm[(np.arange(per_client) + p * per_client) % num_classes]) for p in range(num_clients)]
    sets = []
    for p in range(num_clients):
        first = p % num_classes
        others = rng.choice(np.delete(np.arange(num_classes), first), size=per_client - 1, replace=False)
        sets.append(np.sort(np.concatenate([[first], others])))
    return sets


def classes(labels: np.ndarray, num_clients: int, per_client: int, rng: np.random.Generator,
            assignment: str = "round_robin") -> list[np.ndarray]:
    """Pathological label skew: each client holds `per_client` classes; the samples of a class are split
    into near-equal disjoint chunks among the clients holding it."""
    present = np.unique(labels)
    sets = class_sets(num_clients, len(present), per_client, rng, assignment)
    holders: dict[int, list[int]] = {}
    for client, s in enumerate(sets):
        for k in s:
            holders.setdefault(int(present[k]), []).append(client)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c, clients in holders.items():
        idx = rng.permutation(np.flatnonzero(labels == c))
        for client, chunk in zip(clients, np.array_split(idx, len(clients))):
            parts[client].append(chunk)
    empty = [i for i, p in enumerate(parts) if not sum(len(c) for c in p)]
    if empty:
        raise ConfigError(f"clients {empty[:5]} got no samples; lower data.num_clients or raise the dataset size")
    return [np.sort(np.concatenate(p)) for p in parts]


def shards(labels: np.ndarray, num_clients: int, per_client: int, rng: np.random.Generator) -> list[np.ndarray]:
    """fedlab `shards_partition` (FedDRM's S-SPC): sort by label, cut into M*S equal shards, deal S random
    shards to each client."""
    num_shards = num_clients * per_client
    if num_shards > len(labels):
        raise ConfigError(f"data.num_clients x data.partition.shards_per_client = {num_shards} shards exceed the "
                          f"{len(labels)} samples")
    order = np.argsort(labels, kind="stable")
    size = len(labels) // num_shards
    shard_ids = rng.permutation(num_shards)
    return [np.sort(np.concatenate([order[s * size:(s + 1) * size] for s in shard_ids[c::num_clients]]))
            for c in range(num_clients)]


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


def matched_sample(labels: np.ndarray, pool_labels: np.ndarray, rng: np.random.Generator,
                   taken: np.ndarray | None = None) -> np.ndarray:
    """Positions in a test pool with the same label histogram as `labels` (sampled without replacement,
    capped by what the pool holds), e.g. a client's test set drawn from the official test split."""
    out = []
    free = np.ones(len(pool_labels), dtype=bool) if taken is None else ~taken
    for c, count in zip(*np.unique(labels, return_counts=True)):
        cand = np.flatnonzero((pool_labels == c) & free)
        out.append(rng.choice(cand, size=min(count, len(cand)), replace=False))
    return np.sort(np.concatenate(out)) if out else np.zeros(0, dtype=np.int64)


def _check_enough(n: int, num_clients: int, per_client: int, key: str) -> None:
    if per_client * num_clients > n:
        raise ConfigError(f"{key}={per_client} x data.num_clients={num_clients} exceeds the {n} samples available")
