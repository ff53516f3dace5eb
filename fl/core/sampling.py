"""Seeded draws of positions without replacement, as the data pipeline makes them: stratified by a key (held-out
test sets, public sets, target sets, per-client test sets), a shuffled hold-out, a subsample."""
from __future__ import annotations

from typing import Optional

import numpy as np


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
