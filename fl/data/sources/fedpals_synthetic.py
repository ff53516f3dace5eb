"""FedPALS' synthetic task (paper Sec. 5.2, App. A.2): K = 3 Gaussian classes in 2-d, two clients.

p(x | y) = N(mu_y, I) with mu = ([6, 4.6], [1.2, -1.6], [4.6, -5.4]). Client 0 holds 20 + 20 samples of
classes 0 and 1 (S_0 = [.5, .5, 0], n_0 = 40); client 1 holds 9 + 9 of classes 0 and 2 (S_1 = [.5, 0, .5],
n_1 = 18). The domain id of a training sample is its client, so `data.partition.name=domains` reproduces the
split. The test split holds 2000 samples per class; the target's validation and test sets are drawn
from it with the target's proportions (`data.target.distribution`, e.g. T_delta = (1 - delta) [.5, .25, .25] +
delta [0, .5, .5]). A new sample is drawn for each `data.partition.seed` (default 0).
"""
from __future__ import annotations

import torch
from omegaconf import DictConfig

from fl.core import Split, derive_seed
from fl.core.registry import register_dataset
from fl.data.base import Pool

MEANS = torch.tensor([[6.0, 4.6], [1.2, -1.6], [4.6, -5.4]])
CLIENTS = ((20, 20, 0), (9, 0, 9))  # per-class counts of each client
TEST_PER_CLASS = 2000


def _draw(counts, gen: torch.Generator, domain: int | None = None) -> Split:
    y = torch.cat([torch.full((c,), k, dtype=torch.int64) for k, c in enumerate(counts)])
    # drawn in float64, then rounded: torch's float32 normal draws differ between CPU kernels, its float64 ones do not
    x = (MEANS.double()[y] + torch.randn(len(y), 2, generator=gen, dtype=torch.float64)).float()
    return Split(x, y, None if domain is None else torch.full((len(y),), domain, dtype=torch.int64))


@register_dataset("fedpals_synthetic")
def load_fedpals_synthetic(d: DictConfig) -> Pool:
    gen = torch.Generator().manual_seed(derive_seed(d.partition.seed or 0, 0, -1, "fedpals-synthetic"))
    train = Split.cat([_draw(c, gen, i) for i, c in enumerate(CLIENTS)])
    test = _draw((TEST_PER_CLASS,) * 3, gen, 0)
    return Pool("fedpals_synthetic", train, test, 3, ["class0", "class1", "class2"], ["client0", "client1"])
