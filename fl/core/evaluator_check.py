"""What an evaluator's `evaluate` returned, checked where the loop receives it: a dict of metric name -> real number,
every name but client/<i>/... declared in its `metric_directions` (the summaries, reports and sweeps read the
direction), every value finite. An evaluator that cannot measure a metric leaves it out; a NaN would otherwise be
logged, summarised and compared as if it were measured. Found faults stop the run with exit 1, naming the evaluator,
its file, the round and the metric."""
from __future__ import annotations

import math
import numbers

from torch import Tensor

import fl.core.plugins as plugins
from fl.core.metric_directions import declared, lookup
from fl.core.plugin_calls import PluginFault


class EvaluatorFault(PluginFault):
    """An evaluator's result that breaks its contract: a fault in its code."""


def evaluator_label(evaluator) -> str:
    return f"trainer.evaluators: {evaluator.name!r} ({plugins.code_location(type(evaluator).evaluate)})"


def as_number(value):
    """`value` as a float when it is one real number (a Python or numpy scalar, a one-element tensor), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, Tensor):
        return float(value) if value.numel() == 1 and not value.is_complex() else None
    return float(value) if isinstance(value, numbers.Real) else None


def checked_metrics(evaluator, result, rnd: int, model_finite: bool = True) -> dict[str, float]:
    """`result` as {name: float}, or EvaluatorFault saying what is wrong with it. `model_finite`: False once the run
    diverged under trainer.on_divergence=warn, where a non-finite metric measures the model, not the evaluator."""
    where = f"{evaluator_label(evaluator)} returned"
    if not isinstance(result, dict):
        raise EvaluatorFault(f"{where} {plugins.type_name(result)} (round {rnd}), not a dict of metric name -> number")
    directions = declared(type(evaluator))
    out = {}
    for key, value in result.items():
        if not isinstance(key, str):
            raise EvaluatorFault(f"{where} the key {key!r} (round {rnd}); metric names are strings")
        if not key.startswith("client/") and not lookup(key, directions)[0]:
            raise EvaluatorFault(f"{where} {key!r} (round {rnd}), which its metric_directions does not declare; "
                                 "declare it HIGHER, LOWER or NEITHER (fl/core/metric_directions.py)")
        number = as_number(value)
        if number is None:
            raise EvaluatorFault(f"{where} {plugins.type_name(value)} for {key!r} (round {rnd}), not a number")
        if model_finite and not math.isfinite(number):
            raise EvaluatorFault(f"{where} {number} for {key!r} (round {rnd}); an evaluator leaves out a metric it "
                                 "cannot measure rather than log a non-finite value")
        out[key] = number
    return out
