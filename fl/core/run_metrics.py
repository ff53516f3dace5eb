"""The metrics a run will log, each with the direction its logger declares (fl/core/metric_directions.py), known from
the config before the run starts: the loop's, the method's client and server, the evaluators the config enables, the
clients' evaluation (again as val/ with validation splits) and the config's callbacks. Early stopping and sweeps refuse
a metric outside them before any work; summaries and reports read their directions."""
from __future__ import annotations

from omegaconf import DictConfig

from fl.core.callbacks import callback_class
from fl.core.evaluation import client_metric_directions
from fl.core.loop import LOOP_METRICS, ROBUST_METRICS, validation_keys
from fl.core.metric_directions import Directions, declared
from fl.core.registry import AGGREGATORS, EVALUATORS, METHODS, evaluator_names, load_plugins
from fl.core.server import Server


def diagnostics(cfg: DictConfig) -> list[str]:
    """What the console's summary shows under "diagnostics" beside the evaluators' test metrics: the method's own
    metrics (its clients' training scalars but the loss, its server's) and the evaluators' outside test/ and val/,
    one key per value (a `prefix*` pattern, one value per client, is left to the files)."""
    load_plugins()
    spec = METHODS[cfg.method.name]
    keys = [f"train/{k}" for k in declared(spec.client_cls) if k != "loss"] + list(declared(spec.server_cls))
    for name in evaluator_names(cfg.trainer.evaluators):
        keys += [k for k in EVALUATORS[name].logged_directions(cfg, spec.client_cls) if not k.startswith(("test/",
                                                                                                        "val/"))]
    return [k for k in dict.fromkeys(keys) if not k.endswith("*")]


def run_directions(cfg: DictConfig) -> Directions:
    """Every key (or `prefix*` pattern) a run of `cfg` may log but client/<i>/..., with its direction."""
    load_plugins()
    spec = METHODS[cfg.method.name]
    out = dict(LOOP_METRICS)
    if AGGREGATORS[cfg.server.aggregator.name].robust and spec.server_cls.aggregate is Server.aggregate:
        out.update(ROBUST_METRICS)
    out.update({f"train/{k}": v for k, v in declared(spec.client_cls).items()})
    tested = client_metric_directions(cfg, spec.client_cls)
    validated = dict(tested)
    for name in evaluator_names(cfg.trainer.evaluators):
        evaluator = EVALUATORS[name]
        logs = evaluator.logged_directions(cfg, spec.client_cls)
        tested.update(logs)
        if evaluator.on_validation:
            validated.update(logs)
    out.update(tested)
    if cfg.data.val_fraction:  # the same evaluation on the validation splits: test/X -> val/X
        out.update(validation_keys(validated))
    out.update(declared(spec.server_cls))
    for entry in cfg.get("callbacks") or []:
        out.update(declared(callback_class(entry)[0]))
    return out
