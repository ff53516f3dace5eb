"""Datasets, partitions and client transforms, registered by name; `build_data(cfg)` loads the configured dataset's
Pool and splits it over the clients (fl/data/federate.py)."""
from __future__ import annotations

from omegaconf import DictConfig

from fl.config import ConfigError
from fl.core import ClientData, FederatedData, Split, Target, plugins
from fl.core.plugin_calls import blamed
from fl.core.registry import DATASETS
from fl.data import augment, client_transforms, partitions, sources  # noqa: F401  (fill the registry)
from fl.data.base import DataError, Pool, check_pool
from fl.data.cache import MAPPED
from fl.data.federate import federate

__all__ = ["ClientData", "DataError", "FederatedData", "Pool", "Split", "Target", "build_data"]


def dataset_label(d: DictConfig) -> str:
    """How a message names the dataset: its files for `arrays`, else data.name and, for a plug-in from outside fl,
    the file and line of its function."""
    if d.name == "arrays":
        return str(d.root)
    where = f"data.name={d.name!r}"
    return where + (f" ({plugins.code_location(DATASETS[d.name].fn)})" if plugins.outside("dataset", d.name) else "")


def build_data(cfg: DictConfig) -> FederatedData:
    seed = cfg.data.partition.seed if cfg.data.partition.seed is not None else cfg.seed
    d = cfg.data
    plugin = DATASETS[d.name]
    with blamed("data.name", d.name, plugin.fn):
        pool = plugin.fn(d)
    if d.cache == "mmap" and not pool.train.mapped:
        raise ConfigError(f"data.cache=mmap: data.name={d.name!r} is read into memory (no image cache); memory-mapped "
                          f"are {', '.join(MAPPED)}; use data.cache=auto or memory")
    check_pool(pool, dataset_label(d))  # before any run dir exists
    return federate(pool, d, seed)
