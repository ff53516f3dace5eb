"""Evaluators: extra evaluation metrics that apply to every method (system accuracy, adaptability, ...).

An evaluator is `fn(orch, round) -> dict[str, float]`, registered by name. On each evaluation round the
orchestrator runs the ones `trainer.evaluators` names (null = all registered with default=True) after
the per-client accuracies. Every process calls it, so it may use Fabric collectives; it must return
the same dict on every process. Its own settings live under `trainer.` in fl/config.py.
"""
from __future__ import annotations

from typing import Callable

EVALUATORS: dict[str, Callable] = {}
DEFAULT_EVALUATORS: list[str] = []
LOCAL_HOOKS: dict[str, Callable] = {}  # evaluator name -> fn(orch, round, cid, module)


def register_evaluator(name: str, default: bool = True):
    def deco(fn: Callable) -> Callable:
        if name in EVALUATORS:
            raise KeyError(f"evaluator {name!r} is registered twice")
        EVALUATORS[name] = fn
        if default:
            DEFAULT_EVALUATORS.append(name)
        return fn
    return deco


def register_local_hook(name: str):
    """`fn(orch, round, cid, module)` for evaluator `name`: runs (when that evaluator is enabled) right
    after each client's local training, before its upload is reduced, on the process that trained it,
    so an evaluator can score the local models (e.g. FedACD's adaptability). It must leave the module's
    weights alone; it may stash results on `orch` for the evaluator, which gathers them across processes."""
    def deco(fn: Callable) -> Callable:
        if name in LOCAL_HOOKS:
            raise KeyError(f"local-model hook {name!r} is registered twice")
        LOCAL_HOOKS[name] = fn
        return fn
    return deco


def enabled_evaluators(names) -> list[str]:
    return list(DEFAULT_EVALUATORS) if names is None else list(names)
