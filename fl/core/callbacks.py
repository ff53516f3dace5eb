"""Callbacks: a user's hooks into the round loop, with the narrow contexts the server's hooks get, named in the
config by import path (`callbacks: [{class: pkg.mod.Cls, <keyword arguments>}]`), and early stopping
(`trainer.early_stop`), which is one of them."""
from __future__ import annotations

import difflib
import importlib
import inspect
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Optional

from omegaconf import DictConfig, OmegaConf

from fl.core.context import RoundContext
from fl.core.metric_directions import Directions


class CallbackError(ValueError):
    """A callback named in the config cannot be built, or finds the run unusable (exit code 2, one line)."""


class Callback:
    """Hooks the loop calls on every process, after the method's server's (all are Fabric callbacks: fabric.call),
    in the order of the config's `callbacks` list, early stopping last:

    on_round_start(ctx, selected)   a training round starts with these clients
    on_evaluate(ctx, metrics)       an evaluation round's metrics are in (test/*, val/*, the round's train/*); a
                                    callback may add its own
    on_round_end(ctx, metrics)      a training round's metrics are complete
    on_checkpoint(ctx, path)        the checkpoint of round ctx.round was written to `path` (by process 0)

    Fine-tuning rounds and rounds without clients get on_evaluate only. `ctx` is a RoundContext (the round, Fabric,
    the data, the config); `ctx.stop(reason)` ends the run after this round. `state_dict()` goes into each
    checkpoint and comes back through `load_state_dict` on resume, so a resumed run continues exactly.
    `metric_directions` names the metrics a callback adds in on_evaluate and which way each is better
    (fl/core/metric_directions.py), so early stopping and summaries know them before the run starts.
    """

    metric_directions: ClassVar[Directions] = {}

    def on_round_start(self, ctx: RoundContext, selected: list[int]) -> None:
        pass

    def on_evaluate(self, ctx: RoundContext, metrics: dict[str, float]) -> None:
        pass

    def on_round_end(self, ctx: RoundContext, metrics: dict[str, float]) -> None:
        pass

    def on_checkpoint(self, ctx: RoundContext, path: Path) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    @classmethod
    def check_arguments(cls, **kwargs: Any) -> None:
        """Refuse bad keyword arguments of a `callbacks:` entry (raise CallbackError naming the argument): fl.train
        calls it while it checks the config, before any work; by default every value is taken."""


class EarlyStopping(Callback):
    """Stops the run when `metric` has not improved for `patience` evaluations in a row (default 5, as
    trainer.early_stop's): improved means above the best so far by more than `min_delta` (mode max) or below it (mode
    min); a non-finite value never improves.
    In a config (trainer.early_stop, or a `callbacks:` entry) the metric must be one the run logs, and `mode`, left
    out, is the direction its logger declares (fl/core/metric_directions.py)."""

    @classmethod
    def check_arguments(cls, **kwargs: Any) -> None:
        metric, patience = kwargs.get("metric", "?"), kwargs.get("patience", 1)
        mode, min_delta = kwargs.get("mode", "max"), kwargs.get("min_delta", 0.0)
        if not isinstance(metric, str) or not metric:
            raise CallbackError(f"metric={metric!r}: name a logged metric, e.g. val/acc_mean_clients")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise CallbackError(f"patience={patience!r}: the evaluations without improvement before the run stops, "
                                "an integer >= 1")
        if mode not in ("max", "min"):
            raise CallbackError(f"mode={mode!r} is not valid; choices: max (higher is better), min (lower is "
                                "better), or leave it out: the metric's declared direction")
        if isinstance(min_delta, bool) or not isinstance(min_delta, (int, float)) or not 0 <= min_delta < math.inf:
            raise CallbackError(f"min_delta={min_delta!r}: the margin an improvement must exceed, a number >= 0")

    def __init__(self, metric: str, patience: int = 5, mode: str = "max", min_delta: float = 0.0):
        self.check_arguments(metric=metric, patience=patience, mode=mode, min_delta=min_delta)
        self.metric, self.patience, self.mode, self.min_delta = metric, patience, mode, min_delta
        self.best: Optional[float] = None
        self.best_round: Optional[int] = None
        self.wait = 0  # evaluations since the best

    def improves(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.best is None:
            return True
        return value > self.best + self.min_delta if self.mode == "max" else value < self.best - self.min_delta

    def on_evaluate(self, ctx: RoundContext, metrics: dict[str, float]) -> None:
        if self.metric not in metrics:
            close = difflib.get_close_matches(self.metric, list(metrics), n=3)
            raise CallbackError(f"trainer.early_stop.metric={self.metric!r} is not among the metrics of the evaluation "
                                f"of round {ctx.round}" + (f"; close: {', '.join(close)}" if close else ""))
        value = float(metrics[self.metric])
        if self.improves(value):
            self.best, self.best_round, self.wait = value, ctx.round, 0
            return
        self.wait += 1
        if self.wait >= self.patience:
            best = "none finite" if self.best is None else f"best {self.best:.6g} at round {self.best_round}"
            ctx.stop(f"early stop: {self.metric} did not improve for {self.wait} evaluations ({best}; "
                     f"trainer.early_stop.patience={self.patience}, mode={self.mode}, min_delta={self.min_delta:g})")

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_round": self.best_round, "wait": self.wait}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_round, self.wait = state["best"], state["best_round"], state["wait"]


def callback_class(spec: Any) -> tuple[type, dict[str, Any]]:
    """The class and keyword arguments of one `callbacks:` entry, {class: pkg.mod.Cls, key: value, ...}; raises
    CallbackError naming what is wrong (the class cannot be imported, is not a Callback, or does not take a key)."""
    if isinstance(spec, DictConfig):
        spec = OmegaConf.to_container(spec, resolve=True)
    if not isinstance(spec, Mapping) or not isinstance(spec.get("class"), str):
        raise CallbackError(f"each entry is {{class: pkg.module.Class, <its keyword arguments>}}; got {spec!r}")
    kwargs = {k: v for k, v in spec.items() if k != "class"}
    path = spec["class"]
    module_name, _, name = path.rpartition(".")
    if not module_name:
        raise CallbackError(f"class={path!r} is not an import path such as mypackage.callbacks.MyCallback")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # ImportError, or the module's own error at import: one line either way
        raise CallbackError(f"class={path!r}: cannot import {module_name}: {type(err).__name__}: "
                            f"{str(err).splitlines()[0] if str(err) else ''}") from None
    cls = getattr(module, name, None)
    if cls is None:
        raise CallbackError(f"class={path!r}: {module_name} has no {name}")
    if not (isinstance(cls, type) and issubclass(cls, Callback)):
        raise CallbackError(f"class={path!r} is not a subclass of fl.core.Callback")
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as err:
        raise CallbackError(f"class={path!r} does not take {kwargs}: {err}") from None
    try:
        cls.check_arguments(**kwargs)
    except CallbackError as err:
        raise CallbackError(f"class={path!r}: {err}") from None
    return cls, kwargs


def make_callbacks(cfg: DictConfig) -> list[Callback]:
    """The config's `callbacks`, in order, then early stopping (`trainer.early_stop.metric` set), which so sees the
    metrics the others add."""
    callbacks = []
    for i, spec in enumerate(cfg.get("callbacks") or []):
        cls, kwargs = callback_class(spec)
        try:
            callbacks.append(cls(**kwargs))
        except Exception as err:  # the user's constructor refused its arguments
            raise CallbackError(f"callbacks[{i}]: {cls.__module__}.{cls.__name__}(**{kwargs}) failed: "
                                f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from None
    stop = cfg.trainer.early_stop
    if stop.metric is not None:
        callbacks.append(EarlyStopping(stop.metric, int(stop.patience), stop.mode, float(stop.min_delta)))
    return callbacks
