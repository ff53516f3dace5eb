"""Seeded mini-batches of a client's data, fetched one batch ahead, and the training-time augmentations applied to
them."""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Optional, TypeVar

import torch
from torch import Tensor

from fl.core.registry import AUGMENTATIONS, load_plugins


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


def count_batches(n: int, batch_size: int, epochs: Optional[int], steps: Optional[int], drop_last: bool) -> int:
    """How many batches `batch_indices` yields for these arguments, without drawing them: a client smaller than a
    batch takes one batch of all its samples, drop_last or not; only a client without samples takes none."""
    if n == 0:
        return 0
    if steps is not None:
        return steps
    b = min(batch_size, n)
    return epochs * (n // b if drop_last else math.ceil(n / b))


# trainer.eval_batch_size=null: on a CPU 128, within 30% of the fastest for the small CNN at 16 and 32 px on 1 and 2
# threads, where 1024 took up to 2.1x as long per image at 32 px (its activations leave the cache; bench/eval_cost.py,
# bench/README.md); on an accelerator large batches keep it busy
CPU_EVAL_BATCH = 128
ACCELERATOR_EVAL_BATCH = 1024


def eval_batch_size(cfg, device) -> int:
    """The evaluation batch size on `device`: trainer.eval_batch_size, or when null the device's default."""
    size = cfg.trainer.eval_batch_size
    if size is not None:
        return size
    return CPU_EVAL_BATCH if torch.device(device).type == "cpu" else ACCELERATOR_EVAL_BATCH


T = TypeVar("T")
_worker: Optional[ThreadPoolExecutor] = None


def one_ahead(items: Iterable[tuple[int, Any]], fetch: Optional[Callable[[Any], T]]
              ) -> Iterator[tuple[int, Any, Optional[T]]]:
    """(epoch, idx, fetch(idx)) for each (epoch, idx) of `items`, fetching the next batch on a worker thread while the
    caller uses this one, across an end of pass too (an idx of None, which comes with None). fetch=None: nothing is
    fetched (None)."""
    global _worker
    if fetch is None:
        yield from ((epoch, idx, None) for epoch, idx in items)
        return
    if _worker is None:
        _worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fl-fetch")
    queue: deque = deque()
    try:
        for epoch, idx in items:
            queue.append((epoch, idx, None if idx is None else _worker.submit(fetch, idx)))
            while idx is not None and len(queue) > 1:  # the next batch is under way: hand over what comes before it
                yield _handed(queue.popleft())
        while queue:
            yield _handed(queue.popleft())
    finally:  # stopped early (or failed): the fetch under way finishes before the caller moves on
        wait([fetched for _, _, fetched in queue if fetched is not None])


def _handed(item: tuple) -> tuple:
    epoch, idx, fetched = item
    return epoch, idx, None if fetched is None else fetched.result()


def augment(x: Tensor, names, gen: torch.Generator) -> Tensor:
    """Apply the named augmentations (`data.augment`, registered by fl/data/augment.py) in order; inputs that
    are not image batches [B, C, H, W] are refused."""
    if names and x.dim() != 4:
        raise ValueError(f"data.augment={list(names)} needs image batches [B, C, H, W]; got shape {tuple(x.shape)}")
    if names:
        load_plugins()  # fl.data registers the augmentations
    for name in names:
        x = AUGMENTATIONS[name](x, gen)
    return x
