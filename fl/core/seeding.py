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
    """Seed torch's global RNGs (dropout, in-model augmentation) for one unit of work: the CPU's and those of the
    accelerators present. torch.manual_seed does the same for every device kind torch knows, each queueing a lazy call
    that records its caller's stack; it cost 3 ms a client under a test runner's deep stacks."""
    value = derive_seed(seed, round_idx, client, purpose)
    torch.default_generator.manual_seed(value)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(value)
    if torch.backends.mps.is_available():
        torch.mps.manual_seed(value)
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        torch.xpu.manual_seed_all(value)
