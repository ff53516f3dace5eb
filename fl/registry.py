"""Name -> implementation registries for methods, datasets and models.

A method registers its typed config, its ClientModule and its Server callback under its paper's name;
nothing in the orchestrator lists methods.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class MethodSpec:
    name: str
    config_cls: type
    client_cls: type
    server_cls: type
    resolve: Optional[Callable] = None  # (cfg) -> None: validate / normalise the method block, raise ConfigError


METHODS: dict[str, MethodSpec] = {}
DATASETS: dict[str, Callable] = {}
MODELS: dict[str, Callable] = {}


def register_method(name: str, config_cls: type, client_cls: type, server_cls: type,
                    resolve: Optional[Callable] = None) -> None:
    if name in METHODS:
        raise KeyError(f"method {name!r} is registered twice")
    METHODS[name] = MethodSpec(name, config_cls, client_cls, server_cls, resolve)


def register_dataset(name: str):
    def deco(fn: Callable) -> Callable:
        DATASETS[name] = fn
        return fn
    return deco


def register_model(name: str):
    def deco(fn: Callable) -> Callable:
        MODELS[name] = fn
        return fn
    return deco
