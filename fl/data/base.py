"""Federated data as tensors: one (train, test) split per client, kept on the device for index batching."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Iterator, Optional

import torch
from torch import Tensor


@dataclass
class Split:
    x: Tensor
    y: Tensor

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def to(self, device, dtype: Optional[torch.dtype] = None) -> "Split":
        """Move to `device`; floating inputs are cast to `dtype` (the model's, e.g. float64 under 64-true)."""
        x = self.x.to(device, dtype) if dtype is not None and self.x.is_floating_point() else self.x.to(device)
        return Split(x, self.y.to(device))

    @staticmethod
    def cat(splits: list["Split"]) -> "Split":
        return Split(torch.cat([s.x for s in splits]), torch.cat([s.y for s in splits]))


@dataclass
class ClientData:
    train: Split
    test: Split
    domain: int = 0


@dataclass
class FederatedData:
    name: str
    num_classes: int
    input_shape: tuple
    clients: list[ClientData]
    partition: list[Tensor] = field(repr=False, default_factory=list)  # per-client indices into the pool
    global_test: Optional[Split] = None  # a held-out test set for the global model, when the dataset has one
    public: Optional[Split] = None  # an unlabeled public set (labels kept for diagnostics only)

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    def train_sizes(self) -> list[int]:
        return [len(c.train) for c in self.clients]

    def test_sizes(self) -> list[int]:
        return [len(c.test) for c in self.clients]

    def label_counts(self, split: str = "train") -> Tensor:
        """[num_clients, num_classes] label histogram of each client's train or test split."""
        return torch.stack([torch.bincount(getattr(c, split).y.cpu(), minlength=self.num_classes)
                            for c in self.clients])

    def pooled_test(self) -> Split:
        return self.global_test if self.global_test is not None else Split.cat([c.test for c in self.clients])

    def pooled_train(self) -> Split:
        return Split.cat([c.train for c in self.clients])

    def fingerprint(self) -> str:
        """Hash of the per-client index lists: two runs with the same fingerprint used the same split."""
        h = hashlib.sha256(self.name.encode())
        for idx in self.partition:
            h.update(idx.to(torch.int64).numpy().tobytes())
            h.update(b"|")
        return h.hexdigest()[:16]

    def to(self, device, dtype: Optional[torch.dtype] = None) -> "FederatedData":
        move = lambda s: None if s is None else s.to(device, dtype)  # noqa: E731
        clients = [ClientData(move(c.train), move(c.test), c.domain) for c in self.clients]
        return FederatedData(self.name, self.num_classes, self.input_shape, clients, self.partition,
                             move(self.global_test), move(self.public))


def batch_indices(n: int, batch_size: int, gen: torch.Generator, *, epochs: Optional[int] = None,
                  steps: Optional[int] = None, drop_last: bool = False) -> Iterator[tuple[int, Optional[Tensor]]]:
    """Shuffled mini-batches as (epoch, indices): `epochs` full passes, or exactly `steps` batches
    (reshuffling at each pass). Each completed pass ends with (epoch, None)."""
    if n == 0:
        return
    batch_size = min(batch_size, n)
    done, epoch = 0, 0
    while True:
        perm = torch.randperm(n, generator=gen)
        stop = n - n % batch_size if drop_last else n
        for start in range(0, stop, batch_size):
            if steps is not None and done >= steps:
                return
            yield epoch, perm[start:start + batch_size]
            done += 1
        yield epoch, None
        epoch += 1
        if epoch >= epochs if steps is None else done >= steps:
            return
