"""The pipeline's second stage: the registered `data.partition` splits what `hold_out` left free among the clients
(and one more part for a target made like them, data.target.distribution=partition), then each client loses its
data.drop_labels."""
from __future__ import annotations

import numpy as np
from omegaconf import DictConfig

from fl.config import ConfigError
from fl.core.plugin_calls import blamed
from fl.core.registry import PARTITIONS
from fl.core.seeding import data_stream
from fl.data.base import Candidates
from fl.data.held_out import HeldOut


def client_parts(h: HeldOut, d: DictConfig, seed: int) -> list[np.ndarray]:
    """Each part's positions in `h.source`: one per client, then the target's when it is a partition."""
    if d.partition.labels == "fine" and h.fine is None:
        raise ConfigError(f"data.partition.labels=fine needs a dataset with fine labels (cifar20); "
                          f"data.name={d.name!r} has none")
    avail = np.flatnonzero(h.free)
    labels = (h.fine if d.partition.labels == "fine" else h.source.y).numpy()[avail]
    domains = None if h.source.domain is None else h.source.domain.numpy()[avail]
    num_parts = d.num_clients + (1 if d.target.distribution == "partition" else 0)
    plugin = PARTITIONS[d.partition.name]
    with blamed("data.partition.name", d.partition.name, plugin.fn):
        given = plugin.fn(Candidates(labels, domains, d.name), num_parts, d.partition, data_stream(seed, "partition"))
    parts = [avail[p] for p in checked_parts(given, num_parts, len(avail), d, plugin.overlap)]
    if d.drop_labels is not None:  # per-client labels removed (FedPALS' PACS: client k loses label k); the target's
        # part keeps all
        y = h.source.y.numpy()
        parts = [p[~np.isin(y[p], np.atleast_1d(drop))] for p, drop in zip(parts, d.drop_labels)] + \
            parts[len(d.drop_labels):]
    return parts


def checked_parts(parts, num_parts: int, n: int, d: DictConfig, overlap: bool) -> list[np.ndarray]:
    """A partition's output as int64 arrays, once it keeps the contract (fl/data/partitions/__init__.py): exactly
    one array per part, of integer positions into the `n` candidates, no position in two parts (nor twice in one)
    unless the partition registered with overlap=True. A broken one stops the run here, in one line naming the
    partition, rather than as a wrong federation or an IndexError later."""
    name = f"data.partition.name={d.partition.name!r}"
    wanted = f"data.num_clients={d.num_clients}" + (" plus the target's" if num_parts > d.num_clients else "")
    if not hasattr(parts, "__len__") or isinstance(parts, (str, bytes, dict)):
        raise ConfigError(f"{name} returned {type(parts).__name__}; a partition returns a list of {num_parts} arrays "
                          f"of positions, one per client ({wanted})")
    if len(parts) != num_parts:
        raise ConfigError(f"{name} returned {len(parts)} parts for {num_parts} ({wanted}); a partition returns "
                          "exactly one array of positions per client")
    out = []
    for i, part in enumerate(parts):
        p = np.asarray(part)
        if p.size == 0:
            out.append(np.zeros(0, dtype=np.int64))
            continue
        if p.ndim != 1 or p.dtype == bool or not np.issubdtype(p.dtype, np.integer):
            raise ConfigError(f"{name} gave client {i} {p.dtype} positions of shape {p.shape}; positions are a 1-d "
                              "integer array of indices into the candidates (a mask becomes np.flatnonzero(mask), "
                              "floats .astype(np.int64))")
        lo, hi = int(p.min()), int(p.max())
        if lo < 0 or hi >= n:
            raise ConfigError(f"{name} gave client {i} position {lo if lo < 0 else hi}, outside the {n} candidates "
                              f"[0, {n})")
        out.append(p.astype(np.int64, copy=False))
    if not overlap and out:
        owners = np.repeat(np.arange(len(out)), [len(p) for p in out])
        flat = np.concatenate(out)
        counts = np.bincount(flat, minlength=n)
        if counts.max(initial=0) > 1:
            pos = int(np.flatnonzero(counts > 1)[0])
            holders = owners[flat == pos].tolist()
            where = (f"client {holders[0]} twice" if len(set(holders)) == 1 else
                     f"clients {', '.join(map(str, sorted(set(holders))))}")
            raise ConfigError(f"{name} gave position {pos} to {where}; each sample belongs to one client, unless the "
                              "partition registers with @register_partition(..., overlap=True)")
    return out
