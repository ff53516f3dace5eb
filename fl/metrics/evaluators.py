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


def register_evaluator(name: str, default: bool = True):
    def deco(fn: Callable) -> Callable:
        if name in EVALUATORS:
            raise KeyError(f"evaluator {name!r} is registered twice")
        EVALUATORS[name] = fn
        if default:
            DEFAULT_EVALUATORS.append(name)
        return fn
    return deco


def enabled_evaluators(names) -> list[str]:
    return list(DEFAULT_EVALUATORS) if names is None else list(names)
