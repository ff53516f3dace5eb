"""Name -> implementation tables for everything a config can name: methods, datasets, partitions, client
transforms, aggregators, models, evaluators and augmentations.

A method registers its typed config, its ClientModule and its Server under its paper's name; a dataset, a
partition, a client transform and an aggregator register their function with the typed settings their config block
takes (`data.*`, `data.partition.*`, `data.client_transform.*`, `server.aggregator.*`); a model or augmentation
registers a builder; an evaluator registers its class. The config layer checks names against these tables and builds
each block's schema from the chosen entry, and the loop looks implementations up in them, so neither ever imports the
packages that register (`load_plugins` imports them by name, and the modules installed packages name under the
entry-point group `fl.plugins`; the config's `plugins` key names more: fl/core/plugins.py).
"""
from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass
from typing import Optional

import fl.core.plugins as plugins

PLUGIN_PACKAGES = ("fl.data", "fl.models", "fl.metrics", "fl.aggregators", "fl.methods")


@dataclass(frozen=True)
class MethodSpec:
    name: str
    config_cls: type
    client_cls: type
    server_cls: type
    resolve: Optional[Callable] = None  # (cfg) -> None: validate / normalise the method block, raise ConfigError
    headline: Optional[str] = None  # the metric its paper leads with; baselines are read on their setting's
    needs: tuple[str, ...] = ()  # overrides any run of it needs beyond the defaults (a target, a public set, ...)


@dataclass
class NoSettings:
    """A plug-in without settings of its own."""


@dataclass(frozen=True)
class DataPlugin:
    """A dataset, partition or client transform: the function the data pipeline calls (fl/data/federate.py says
    with what) and its typed settings, a dataclass of `param(...)` fields that its config block takes."""
    name: str
    fn: Callable
    settings: type = NoSettings
    batch: Optional[Callable] = None  # a client transform's per-batch form (data.client_transform.after_augment)
    overlap: bool = False  # a partition that may give one sample to several clients (the others never do)


@dataclass(frozen=True)
class AggregatorPlugin:
    """An aggregator: fn(uploads, start, s) -> the new shared parameters, from the round's uploads
    (fl.core.aggregation.Uploads), the shared parameters the clients started from (the server's global model) and
    `s`, the `server.aggregator` block (fl/aggregators/__init__.py); its typed settings; `streams`: it needs only the
    uploads' weighted mean (uploads.mean()), which is summed as clients finish instead of keeping every upload;
    `check(s, clients)`: why the settings cannot work with `clients` clients a round (None: they can), called during
    config validation when trainer.sampling=fixed fixes that number; `robust`: the rule is meant to survive faulty
    clients, so a client whose upload is non-finite is left out of the round (the loop warns and counts it) instead
    of stopping the run."""
    name: str
    fn: Callable
    settings: type = NoSettings
    streams: bool = False
    check: Optional[Callable] = None
    robust: bool = False


METHODS: dict[str, MethodSpec] = {}
DATASETS: dict[str, DataPlugin] = {}
PARTITIONS: dict[str, DataPlugin] = {}
CLIENT_TRANSFORMS: dict[str, DataPlugin] = {}
AGGREGATORS: dict[str, AggregatorPlugin] = {}
MODELS: dict[str, Callable] = {}
EVALUATORS: dict[str, type] = {}
AUGMENTATIONS: dict[str, Callable] = {}


# kind -> its table: what `plugins` reports a failed or twice-registered name under
TABLES: dict[str, dict] = {"method": METHODS, "dataset": DATASETS, "partition": PARTITIONS,
                           "client transform": CLIENT_TRANSFORMS, "aggregator": AGGREGATORS, "model": MODELS,
                           "evaluator": EVALUATORS, "augmentation": AUGMENTATIONS}


def _add(table: dict, kind: str, name: str, obj) -> None:
    """Enter `obj` under `name` in `table`; the module registering it is its origin (the first frame up the stack
    outside this module: the plug-in file's body). A name already taken is refused alone, with a warning: the first
    holder (a built-in, imported first) stays selectable and the module's other registrations stand."""
    if name in table:
        plugins.refuse_taken(kind, name, _registering_module())
        return
    table[name] = obj
    plugins.record_origin(kind, name, _registering_module())


def _registering_module() -> str:
    """The first module up the stack outside this one: the plug-in file that called a registrar."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    return frame.f_globals.get("__name__", "?") if frame is not None else "?"


def register_method(name: str, config_cls: type, client_cls: type, server_cls: type,
                    resolve: Optional[Callable] = None, headline: Optional[str] = None,
                    needs: tuple[str, ...] = ()) -> None:
    """`needs`: the overrides any run of the method needs beyond the defaults, e.g. ("model.norm=batch",): its --help
    shows them, and the shared tests run it with them."""
    _add(METHODS, "method", name, MethodSpec(name, config_cls, client_cls, server_cls, resolve, headline, tuple(needs)))


def _registrar(table: dict, kind: str):
    def register(name: str):
        def deco(obj):
            _add(table, kind, name, obj)
            return obj
        return deco
    return register


# kind -> the keys every choice's block has (a dataset's are data.root, data.num_clients, ...), which a plug-in's
# settings may not redefine: fl/config/schema.py, which declares those blocks, fills this when it is imported (a
# plug-in's `param` comes from there, so before the plug-in registers). The config layer checks again when it builds
# a block, for a plug-in registered before.
SHARED_KEYS: dict[str, frozenset[str]] = {}


def shadowed_keys(kind: str, settings: type) -> list[str]:
    """The fields of a plug-in's settings that have the name of a key every choice of `kind` takes."""
    return sorted({f.name for f in fields(settings)} & SHARED_KEYS.get(kind, frozenset()))


def _data_registrar(table: dict, kind: str, plugin: type = DataPlugin):
    def register(name: str, settings: type = NoSettings, **extra):
        if not is_dataclass(settings):
            raise TypeError(f"{kind} {name!r}: its settings must be a dataclass of param(...) fields, got {settings!r}")
        clash = shadowed_keys(kind, settings)
        if clash:
            block = {"dataset": "data", "partition": "data.partition", "aggregator": "server.aggregator"}.get(
                kind, "data.client_transform")
            raise ValueError(f"{kind} {name!r}: its setting {clash[0]!r} has the name of {block}.{clash[0]}, a key "
                             f"every {kind} takes; rename the setting")

        def deco(fn):
            _add(table, kind, name, plugin(name, fn, settings, **extra))
            return fn
        return deco
    return register


# @register_dataset(name, Settings): fn(d) -> Pool, d the `data` block (its keys and the dataset's settings, data.*)
register_dataset = _data_registrar(DATASETS, "dataset")
# @register_partition(name, Settings[, overlap=True]): fn(candidates, num_clients, s, rng) -> one array of integer
# positions per client, s the `data.partition` block (fl/data/partitions/__init__.py); overlap=True lets one position
# go to several clients
register_partition = _data_registrar(PARTITIONS, "partition")
# @register_client_transform(name, Settings[, batch=fn]): fn(x, client, num_clients, seed, s) -> x, s the
# `data.client_transform` block; batch(x, owner, num_clients, s) -> x (fl/data/client_transforms/__init__.py)
register_client_transform = _data_registrar(CLIENT_TRANSFORMS, "client transform")
# @register_aggregator(name, Settings[, streams=True][, check=fn]): fn(uploads, start, s) -> the new shared parameters
# (AggregatorPlugin; fl/aggregators/__init__.py)
register_aggregator = _data_registrar(AGGREGATORS, "aggregator", AggregatorPlugin)
register_model = _registrar(MODELS, "model")
register_augmentation = _registrar(AUGMENTATIONS, "augmentation")


def register_evaluator(cls: type) -> type:
    """Class decorator: an Evaluator subclass under its `name` (fl/core/evaluation.py)."""
    return _registrar(EVALUATORS, "evaluator")(cls.name)(cls)


def evaluator_names(chosen) -> list[str]:
    """The evaluators a run runs: those `trainer.evaluators` names (`chosen`), or every default one when it is null."""
    return [n for n, cls in EVALUATORS.items() if cls.default] if chosen is None else list(chosen)


def discover(package: str) -> None:
    """Import every module under `package`'s path, in name order (one imported before is not imported again), so a
    plug-in is one file dropped into the folder. A file that fails to import, or registers a name already taken, is
    skipped with one warning line (fl/core/plugins.py). A plug-in package's __init__ calls it; call it again after
    adding a folder to the package's `__path__`."""
    plugins.import_tree(package, TABLES)


def load_plugins() -> None:
    """Import the packages that fill the tables, then the modules of installed packages' `fl.plugins` entry points
    (idempotent, and cheap once done: the loop calls it per batch)."""
    for package in PLUGIN_PACKAGES:
        importlib.import_module(package)
    plugins.import_entry_points(TABLES)


def unavailable(table: dict, name: str) -> Optional[str]:
    """Why `name` cannot be selected from `table` although a module meant to register it (it failed to import, or
    two modules registered the name), in words naming the file; None when nothing is known against it."""
    return plugins.unavailable(_kind(table), name, table)


def not_loaded(table: dict) -> str:
    """The files that failed to import and may have registered into `table` ("" when none did)."""
    return plugins.not_loaded(_kind(table))


def _kind(table: dict) -> str:
    return next(k for k, t in TABLES.items() if t is table)


def import_plugins(modules: list[str]) -> None:
    """The config's `plugins`: import each named module (once), which registers what it defines; a module that
    cannot be found raises plugins.PluginNotFound, one that fails is skipped with one warning line."""
    load_plugins()
    for module in modules:
        plugins.import_named(module, TABLES)


def build_model(cfg, input_shape: tuple, num_classes: int):
    """The configured model (`model.name`), a BackboneHead: `head(backbone(x))`."""
    load_plugins()
    model = MODELS[cfg.model.name](cfg.model, tuple(input_shape), num_classes)
    if cfg.model.get("pretrained"):
        model.load_pretrained(cfg.model.pretrained, bool(cfg.model.get("download", False)))
    if cfg.model.get("proj_dim"):
        model.add_projection(int(cfg.model.proj_dim))
    return model
