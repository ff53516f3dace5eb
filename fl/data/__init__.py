"""Datasets registered by name. A loader returns a Pool; `build_data(cfg)` splits it over the clients."""
from __future__ import annotations

from omegaconf import DictConfig

from fl.data import embedded, sources  # noqa: F401  (registers the loaders)
from fl.data.base import ClientData, DataError, FederatedData, Pool, Split, Target, batch_indices
from fl.data.federate import federate
from fl.registry import DATASETS, register_dataset

__all__ = ["ClientData", "DataError", "FederatedData", "Pool", "Split", "Target", "batch_indices", "build_data"]


@register_dataset("embedded")
def embedded_images(d: DictConfig) -> Pool:
    """The quickstart's procedurally generated images (one domain, no official test split)."""
    x, y = embedded.load_or_generate(d.root, d.num_classes, d.samples_per_class, d.channels, d.image_size or 16,
                                     d.noise)
    pixels = x.double().div(255).transpose(0, 1).flatten(1)  # per-channel statistics for normalisation
    return Pool("embedded", Split(x, y), None, d.num_classes, [f"class{k}" for k in range(d.num_classes)],
                mean=tuple(pixels.mean(1).tolist()), std=tuple(pixels.std(1).tolist()))


@register_dataset("embedded_domains")
def embedded_multi_domain(d: DictConfig) -> Pool:
    """Generated glyph images in `num_domains` visual styles, with a test split of its own."""
    from fl.data.embedded_domains import make_pool

    return make_pool(d.num_classes, d.num_domains, d.samples_per_class, max(1, d.samples_per_class // 3),
                     d.image_size or 32)


def build_data(cfg: DictConfig) -> FederatedData:
    seed = cfg.data.partition_seed if cfg.data.partition_seed is not None else cfg.seed
    return federate(DATASETS[cfg.data.name](cfg.data), cfg.data, seed)
