"""Name -> implementation tables for everything a config can name: methods, datasets, models,
evaluators and augmentations.

A method registers its typed config, its ClientModule and its Server under its paper's name; a dataset,
model or augmentation registers a builder; an evaluator registers its class. The config layer checks
names against these tables, and the loop looks implementations up in them, so neither ever imports the
packages that register (`load_plugins` imports them by name, as entry points would).
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

PLUGIN_PACKAGES = ("fl.data", "fl.models", "fl.metrics", "fl.methods")


@dataclass(frozen=True)
class MethodSpec:
    name: str
    config_cls: type
    client_cls: type
    server_cls: type
    resolve: Optional[Callable] = None  # (cfg) -> None: validate / normalise the method block, raise ConfigError
    headline: Optional[str] = None  # the metric its paper leads with; baselines are read on their setting's


METHODS: dict[str, MethodSpec] = {}
DATASETS: dict[str, Callable] = {}
MODELS: dict[str, Callable] = {}
EVALUATORS: dict[str, type] = {}
AUGMENTATIONS: dict[str, Callable] = {}


def register_method(name: str, config_cls: type, client_cls: type, server_cls: type,
                    resolve: Optional[Callable] = None, headline: Optional[str] = None) -> None:
    if name in METHODS:
        raise KeyError(f"method {name!r} is registered twice")
    METHODS[name] = MethodSpec(name, config_cls, client_cls, server_cls, resolve, headline)


def _registrar(table: dict, kind: str):
    def register(name: str):
        def deco(obj):
            if name in table:
                raise KeyError(f"{kind} {name!r} is registered twice")
            table[name] = obj
            return obj
        return deco
    return register


register_dataset = _registrar(DATASETS, "dataset")
register_model = _registrar(MODELS, "model")
register_augmentation = _registrar(AUGMENTATIONS, "augmentation")


def register_evaluator(cls: type) -> type:
    """Class decorator: an Evaluator subclass under its `name` (fl/core/evaluation.py)."""
    return _registrar(EVALUATORS, "evaluator")(cls.name)(cls)


def load_plugins() -> None:
    """Import the packages that fill the tables (idempotent)."""
    for package in PLUGIN_PACKAGES:
        importlib.import_module(package)


def build_model(cfg, input_shape: tuple, num_classes: int):
    """The configured model (`model.name`), a BackboneHead: `head(backbone(x))`."""
    load_plugins()
    model = MODELS[cfg.model.name](cfg.model, tuple(input_shape), num_classes)
    if cfg.model.get("pretrained"):
        model.load_pretrained(cfg.model.pretrained, bool(cfg.model.get("download", False)))
    if cfg.model.get("proj_dim"):
        model.add_projection(int(cfg.model.proj_dim))
    return model
