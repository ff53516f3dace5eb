"""Every random draw derives from (seed, round, client, purpose).

The same run on 1 or 2 processes, or resumed from a checkpoint, therefore draws the same numbers:
nothing depends on how many draws happened before on this process.
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch


def derive_seed(seed: int, round_idx: int, client: int, purpose: str) -> int:
    key = f"{seed}/{round_idx}/{client}/{purpose}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1  # 63 bits


def generator(seed: int, round_idx: int, client: int, purpose: str) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(seed, round_idx, client, purpose))


def data_stream(seed: int, purpose: str) -> np.random.Generator:
    """The numpy stream of one purpose of building the clients' data (a partition, a held-out set, ...): one per
    purpose, so switching one option does not reshuffle the others."""
    return np.random.default_rng(derive_seed(seed, 0, -1, purpose))


def seed_torch(seed: int, round_idx: int, client: int, purpose: str) -> None:
    """Seed torch's global RNG (dropout, in-model augmentation) for one unit of work."""
    torch.manual_seed(derive_seed(seed, round_idx, client, purpose))
