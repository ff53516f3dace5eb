"""The federated data the loop trains on: one (train, test) split per client, as tensors kept on the device for
index batching, or (a memory-mapped pool, fl/core/mapped_images.py) as index views of the map on the host. Loaders
(fl/data/) produce it; the loop, the methods and the evaluators read it."""
from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import Tensor

from fl.core.mapped_images import MappedImages


@dataclass
class Split:
    """Inputs, labels and (optionally) a domain id per sample. Images may be stored as uint8 [N, C, H, W];
    `FederatedData.prepare` turns a batch into normalised floats. `owner` (per sample, optional) names the
    client whose covariate shift `FederatedData.batch_transform` applies to each batch of these samples.
    `x` may be a `MappedImages` (rows of a memory-mapped pool): subsets and unions are then index lists into the map,
    and the split stays on the host, labels too, so a batch's positions never cross devices."""
    x: Tensor | MappedImages
    y: Tensor
    domain: Optional[Tensor] = None
    owner: Optional[Tensor] = None

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def mapped(self) -> bool:
        return isinstance(self.x, MappedImages)

    def to(self, device, dtype: Optional[torch.dtype] = None) -> Split:
        """Move to `device`; floating inputs are cast to `dtype` (the model's, e.g. float64 under 64-true). A mapped
        split stays where it is: its batches are gathered from the map."""
        if self.mapped:
            return dataclasses.replace(self)
        x = self.x.to(device, dtype) if dtype is not None and self.x.is_floating_point() else self.x.to(device)
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Split(x, self.y.to(device), move(self.domain), move(self.owner))

    def subset(self, idx: Tensor) -> Split:
        pick = lambda t: None if t is None else t[idx]  # noqa: E731
        x = self.x.select(idx) if self.mapped else self.x[idx]
        return Split(x, self.y[idx], pick(self.domain), pick(self.owner))

    @staticmethod
    def cat(splits: list[Split]) -> Split:
        owners = [s.owner for s in splits]
        if any(o is None for o in owners) and not all(o is None for o in owners):
            raise ValueError("cannot pool splits whose batches are transformed per owner with splits that are not")
        join = lambda ts: None if any(t is None for t in ts) else torch.cat(ts)  # noqa: E731
        if all(s.mapped for s in splits) and all(s.x.source is splits[0].x.source for s in splits):
            x = MappedImages.cat([s.x for s in splits])
        else:  # in memory (a mapped split among them is read in)
            x = torch.cat([images(s.x) for s in splits])
        return Split(x, torch.cat([s.y for s in splits]), join([s.domain for s in splits]), join(owners))


def images(x: Tensor | MappedImages) -> Tensor:
    """A split's images as a tensor: a mapped split's are read into memory."""
    return x.load() if isinstance(x, MappedImages) else x


def map_images(splits: list[Split], fn) -> None:
    """fn applied once to the images of `splits` together (random corruptions then differ per image), written back
    split by split, in memory: a transformed image is no longer the cached one."""
    out = fn(torch.cat([images(s.x) for s in splits]))
    for split, part in zip(splits, out.split([len(s) for s in splits])):
        split.x = part


def rows_to(t: Tensor | MappedImages, idx, device: torch.device) -> Tensor:
    """t[idx] (idx: a slice or an index tensor on t's device) on `device`, by a non-blocking copy. From host memory to
    a CUDA device the rows are gathered straight into pinned memory: a copy from pageable memory makes the host wait
    until it is done (and so for the GPU's queue ahead of it), one from pinned memory does not. From a memory-mapped
    split (idx on the CPU) the rows are read from the map, into pinned memory for a CUDA device."""
    cuda = torch.device(device).type == "cuda"
    if isinstance(t, MappedImages):
        return t.gather(idx, pin=cuda).to(device, non_blocking=True)
    host_index = isinstance(idx, slice) or (torch.is_tensor(idx) and idx.device.type == "cpu")
    if t.device.type != "cpu" or not cuda or not host_index:
        return t[idx].to(device, non_blocking=True)
    return gather_rows(t, idx, pin=True).to(device, non_blocking=True)


def gather_rows(t: Tensor, idx, pin: bool) -> Tensor:
    """t[idx] (idx: a slice, an index or a boolean mask) in a new tensor, in pinned memory if `pin` (torch's caching
    host allocator recycles it once the copies that read it are done)."""
    if isinstance(idx, slice) or idx.dtype == torch.bool:
        rows = t[idx]
        return torch.empty(rows.shape, dtype=t.dtype, pin_memory=pin).copy_(rows)
    out = torch.empty((len(idx),) + tuple(t.shape[1:]), dtype=t.dtype, pin_memory=pin)
    if t.dim() > 2 and t.is_contiguous():  # rows as flat vectors: index_select on 4-d uint8 is 10-15x slower
        width = math.prod(t.shape[1:])
        torch.index_select(t.view(len(t), width), 0, idx, out=out.view(len(idx), width))
        return out
    return torch.index_select(t, 0, idx, out=out)


@dataclass
class Target:
    """A target client with its own label distribution (FedPALS): validation and test data follow it."""
    distribution: Tensor  # [K], sums to 1
    val: Split
    test: Split


@dataclass
class ClientData:
    train: Split
    test: Split
    domain: int = 0
    val: Optional[Split] = None  # held out of the client's training data (data.val_fraction), for model selection
    # positions of the test samples in FederatedData.global_test when they are its rows, images unchanged
    # (data.test_split=official without a client transform): a model shared by clients scores each of them once
    test_rows: Optional[Tensor] = None

    def splits(self) -> list[Split]:
        return [self.train, self.test] + ([self.val] if self.val is not None else [])


@dataclass
class FederatedData:
    name: str
    num_classes: int
    input_shape: tuple
    clients: list[ClientData]
    partition: list[Tensor] = field(repr=False, default_factory=list)  # index lists into the pool, hashed
    global_test: Optional[Split] = None  # the dataset's own test set, when the clients' tests come from elsewhere
    public: Optional[Split] = None  # unlabeled public set held out from all clients (labels: diagnostics only)
    target: Optional[Target] = None
    mean: Optional[tuple[float, ...]] = None  # normalisation of uint8 images, see prepare()
    std: Optional[tuple[float, ...]] = None
    class_names: list[str] = field(default_factory=list)
    domain_names: list[str] = field(default_factory=list)
    num_new_clients: int = 0  # the last clients, held out of training (evaluated only)
    # (uint8 batch, owner per sample) -> batch: a covariate shift applied after augmentation to batches of
    # splits with an `owner` (data.client_transform.after_augment), as pipelines that crop first do
    batch_transform: Optional[Callable[[Tensor, Tensor], Tensor]] = field(default=None, repr=False)
    # (device, dtype, ndim) -> (mean, std) shaped to broadcast over a batch, built by prepare() on first use
    _normalisation: dict = field(default_factory=dict, init=False, repr=False, compare=False)
    _pooled_test: Optional[Split] = field(default=None, init=False, repr=False, compare=False)  # see pooled_test()

    def prepare(self, x: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
        """A batch as the model sees it: uint8 images become normalised floats; float inputs pass through."""
        if x.dtype != torch.uint8:
            return x
        x = x.to(dtype).div_(255)
        if self.mean is not None:
            mean, std = self._mean_std(x.device, dtype, x.dim())
            x = x.sub_(mean).div_(std)
        return x

    def _mean_std(self, device: torch.device, dtype: torch.dtype, ndim: int) -> tuple[Tensor, Tensor]:
        """mean and std as tensors on `device`, made once: a tensor built from a list on a GPU is a blocking
        host-to-device copy, which per batch would stall the GPU."""
        key = (device, dtype, ndim)
        if key not in self._normalisation:
            shape = (1, -1) + (1,) * (ndim - 2)
            self._normalisation[key] = (torch.tensor(self.mean, dtype=dtype, device=device).view(shape),
                                        torch.tensor(self.std, dtype=dtype, device=device).view(shape))
        return self._normalisation[key]

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    @property
    def num_train_clients(self) -> int:
        """Clients 0 .. num_train_clients - 1 take part in training; the rest are new clients."""
        return len(self.clients) - self.num_new_clients

    def train_sizes(self) -> list[int]:
        return [len(c.train) for c in self.clients]

    def test_sizes(self) -> list[int]:
        return [len(c.test) for c in self.clients]

    def label_counts(self, split: str = "train") -> Tensor:
        """[num_clients, num_classes] label histogram of each client's train or test split."""
        return torch.stack([torch.bincount(getattr(c, split).y.cpu(), minlength=self.num_classes)
                            for c in self.clients])

    def pooled_test(self) -> Split:
        """The global test set, or else the union of the clients' test splits, made on first use and kept: evaluators
        ask for it every evaluation round, and each union is a copy on the data's device (which it now holds for the
        run, as every evaluation held it before). The splits are final once fl/data has built them; `to` and
        `validation_view` make new objects, with their own union."""
        if self.global_test is not None:
            return self.global_test
        if self._pooled_test is None:
            self._pooled_test = Split.cat([c.test for c in self.clients])
        return self._pooled_test

    def pooled_test_rows(self, cid: int) -> Optional[Tensor | slice]:
        """Where client cid's test samples are in `pooled_test()`: its slice of the union of the clients' test splits,
        or its positions in the global test set it was drawn from (`ClientData.test_rows`); None when they are not
        rows of it."""
        if self.global_test is None:
            start = sum(len(c.test) for c in self.clients[:cid])
            return slice(start, start + len(self.clients[cid].test))
        return self.clients[cid].test_rows

    def pooled_train(self) -> Split:
        """The training data of the clients that train (new clients' data stays theirs)."""
        return Split.cat([c.train for c in self.clients[:self.num_train_clients]])

    @property
    def has_validation(self) -> bool:
        return any(c.val is not None for c in self.clients)

    def validation_view(self) -> FederatedData:
        """The same federation with each client's validation split in place of its test split (and their union
        as the pooled test set), so every evaluation runs unchanged on validation data."""
        clients = [ClientData(c.train, c.val, c.domain, c.val) for c in self.clients]
        return dataclasses.replace(self, clients=clients, global_test=None, target=None)

    def fingerprint(self) -> str:
        """Hash of the per-client index lists: two runs with the same fingerprint used the same split."""
        h = hashlib.sha256(self.name.encode())
        for idx in self.partition:
            h.update(idx.to(torch.int64).numpy().tobytes())
            h.update(b"|")
        return h.hexdigest()[:16]

    def to(self, device, dtype: Optional[torch.dtype] = None) -> FederatedData:
        move = lambda s: None if s is None else s.to(device, dtype)  # noqa: E731
        rows = lambda t: None if t is None else t.to(device)  # noqa: E731
        clients = [ClientData(move(c.train), move(c.test), c.domain, move(c.val), rows(c.test_rows))
                   for c in self.clients]
        target = None if self.target is None else Target(self.target.distribution, move(self.target.val),
                                                         move(self.target.test))
        return dataclasses.replace(self, clients=clients, global_test=move(self.global_test),
                                   public=move(self.public), target=target)
