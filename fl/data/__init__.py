"""Datasets registered by name. A loader returns a Pool; `build_data(cfg)` splits it over the clients."""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from omegaconf import DictConfig

from fl.config import ConfigError
from fl.core import ClientData, FederatedData, Split, Target
from fl.core.federated_data import images
from fl.core.registry import DATASETS, register_dataset
from fl.data import augment, embedded, embedded_domains, sources  # noqa: F401  (register augmentations, loaders)
from fl.data.base import DataError, Pool, check_no_variant, check_pool
from fl.data.cache import MAPPED, cache_mode, cached_images
from fl.data.federate import federate

__all__ = ["ClientData", "DataError", "FederatedData", "Pool", "Split", "Target", "build_data"]


@register_dataset("embedded")
def embedded_images(d: DictConfig) -> Pool:
    """The quickstart's procedurally generated images (one domain, no official test split)."""
    check_no_variant(d, "embedded")
    e, size = d.embedded, d.image_size or 16
    n = e.num_classes * e.samples_per_class
    mode = cache_mode(d, n * e.channels * size * size, "embedded")
    if mode[0] == "memory":
        x, y = embedded.load_or_generate(d.root, e.num_classes, e.samples_per_class, e.channels, size, e.noise)
    else:
        key = embedded.cache_key(e.num_classes, e.samples_per_class, e.channels, size, e.noise)
        x = cached_images(d, dataset="embedded", folder=Path(d.root) / "embedded", tag=_tag(key), key=key,
                          counts={"train": n}, shape=(e.channels, size, size), parts=[n], mode=mode,
                          fill=lambda i: embedded.generate(e.num_classes, e.samples_per_class, e.channels, size,
                                                           e.noise)[0])["train"]
        y = embedded.labels(e.num_classes, e.samples_per_class)
    pixels = images(x).double().div(255).transpose(0, 1).flatten(1)  # per-channel statistics for normalisation
    return Pool("embedded", Split(x, y), None, e.num_classes, [f"class{k}" for k in range(e.num_classes)],
                mean=tuple(pixels.mean(1).tolist()), std=tuple(pixels.std(1).tolist()))


@register_dataset("embedded_domains")
def embedded_multi_domain(d: DictConfig) -> Pool:
    """Generated glyph images in `num_domains` visual styles, with a test split of its own."""
    check_no_variant(d, "embedded_domains")
    e, size = d.embedded, d.image_size or 32
    per_test = max(1, e.samples_per_class // 3)
    nbytes = e.num_domains * e.num_classes * (e.samples_per_class + per_test) * 3 * size * size
    mode, store = cache_mode(d, nbytes, "embedded_domains"), None
    if mode[0] == "mmap":
        key = "-".join(map(str, (embedded_domains.CACHE_VERSION, e.num_classes, e.num_domains, e.samples_per_class,
                                 per_test, size)))
        store = functools.partial(cached_images, d, dataset="embedded_domains", mode=mode, key=key, tag=_tag(key),
                                  folder=Path(d.root) / "embedded_domains")
    return embedded_domains.make_pool(e.num_classes, e.num_domains, e.samples_per_class, per_test, size, store)


def _tag(key: str) -> str:
    """A generated pool's cache is named by its settings' hash (the key is those settings)."""
    return hashlib.sha1(key.encode()).hexdigest()[:12]


def build_data(cfg: DictConfig) -> FederatedData:
    seed = cfg.data.partition.seed if cfg.data.partition.seed is not None else cfg.seed
    d = cfg.data
    pool = DATASETS[d.name](d)
    if d.cache == "mmap" and not pool.train.mapped:
        raise ConfigError(f"data.cache=mmap: data.name={d.name!r} is read into memory (no image cache); memory-mapped "
                          f"are {', '.join(MAPPED)}; use data.cache=auto or memory")
    check_pool(pool, str(d.root) if d.name == "arrays" else f"data.name={d.name!r}")  # before any run dir exists
    return federate(pool, d, seed)
