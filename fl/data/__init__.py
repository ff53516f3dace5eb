"""Datasets registered by name. A loader returns a Pool; `build_data(cfg)` splits it over the clients."""
from __future__ import annotations

from omegaconf import DictConfig

from fl.core import ClientData, FederatedData, Split, Target
from fl.core.registry import DATASETS, register_dataset
from fl.data import augment, embedded, embedded_domains, sources  # noqa: F401  (register augmentations, loaders)
from fl.data.base import DataError, Pool, check_no_variant, check_pool
from fl.data.federate import federate

__all__ = ["ClientData", "DataError", "FederatedData", "Pool", "Split", "Target", "build_data"]


@register_dataset("embedded")
def embedded_images(d: DictConfig) -> Pool:
    """The quickstart's procedurally generated images (one domain, no official test split)."""
    check_no_variant(d, "embedded")
    e = d.embedded
    x, y = embedded.load_or_generate(d.root, e.num_classes, e.samples_per_class, e.channels, d.image_size or 16,
                                     e.noise)
    pixels = x.double().div(255).transpose(0, 1).flatten(1)  # per-channel statistics for normalisation
    return Pool("embedded", Split(x, y), None, e.num_classes, [f"class{k}" for k in range(e.num_classes)],
                mean=tuple(pixels.mean(1).tolist()), std=tuple(pixels.std(1).tolist()))


@register_dataset("embedded_domains")
def embedded_multi_domain(d: DictConfig) -> Pool:
    """Generated glyph images in `num_domains` visual styles, with a test split of its own."""
    check_no_variant(d, "embedded_domains")
    e = d.embedded
    return embedded_domains.make_pool(e.num_classes, e.num_domains, e.samples_per_class,
                                      max(1, e.samples_per_class // 3), d.image_size or 32)


def build_data(cfg: DictConfig) -> FederatedData:
    seed = cfg.data.partition.seed if cfg.data.partition.seed is not None else cfg.seed
    d = cfg.data
    pool = DATASETS[d.name](d)
    check_pool(pool, str(d.root) if d.name == "arrays" else f"data.name={d.name!r}")  # before any run dir exists
    return federate(pool, d, seed)
