"""Which way each logged metric is better, declared beside the code that logs it, never guessed from its name.

Every class that logs metrics declares them in a `metric_directions` class attribute, name -> HIGHER, LOWER or
NEITHER (a diagnostic, such as an effective sample size, that is neither better high nor low):
- `ClientModule`: the scalars its `training_step` returns, by their short name ("loss", "ce"), logged as train/<name>;
- `Server`: the keys it adds to the round's metrics (on_round_end, on_evaluate), in full ("server/ess");
- `Evaluator`: the keys its `evaluate` returns, in full (its test/X are also val/X when it runs on validation
  splits); its `logged_directions(cfg, client_cls)` narrows them to what it logs in a given run;
- `Callback`: the keys it adds in on_evaluate, in full.
A subclass declares only its own; the declarations of its bases are merged in (`declared`). A key may end in `*`
(server/alpha/* for one value per client). Per-client keys (client/<i>/...) are not summarised and need none.

fl/core/run_metrics.py gathers a run's declarations before it starts (early stopping and sweeps check their metric
against them); the summaries (summary.json's best and best round, the console table, W&B's best/*), the reports'
bold cells and model selection, early stopping's mode and a sweep file's goal all read them.
"""
from __future__ import annotations

from typing import Optional

HIGHER, LOWER = "max", "min"  # the values of trainer.early_stop.mode; W&B's goals are maximize / minimize
NEITHER = None
GOALS = {HIGHER: "maximize", LOWER: "minimize"}

Directions = dict[str, Optional[str]]


def declared(cls: type, attr: str = "metric_directions") -> Directions:
    """`attr` of `cls` merged over its bases (a base's first, so a subclass may redeclare one), each value
    checked."""
    out: Directions = {}
    for klass in reversed(cls.__mro__):
        own = vars(klass).get(attr)
        if own:
            out.update(own)
    bad = {k: v for k, v in out.items() if v not in (HIGHER, LOWER, NEITHER)}
    if bad:
        key, value = next(iter(bad.items()))
        raise ValueError(f"{cls.__module__}.{cls.__qualname__}.{attr}[{key!r}] = {value!r}; a metric's direction is "
                         "HIGHER ('max'), LOWER ('min') or NEITHER (None), from fl.core.metric_directions")
    return out


def lookup(key: str, directions: Directions) -> tuple[bool, Optional[str]]:
    """(whether `key` is declared, its direction): an exact entry, else the longest `prefix*` pattern it matches."""
    if key in directions:
        return True, directions[key]
    patterns = [p for p in directions if p.endswith("*") and key.startswith(p[:-1])]
    if not patterns:
        return False, NEITHER
    return True, directions[max(patterns, key=len)]


def directions_of(keys, directions: Directions) -> dict[str, Optional[str]]:
    """Each of `keys` that is declared, with its direction (NEITHER included: declared, but no better way)."""
    out = {}
    for key in keys:
        known, direction = lookup(key, directions)
        if known:
            out[key] = direction
    return out


def describe(direction: Optional[str]) -> str:
    return {HIGHER: "higher is better", LOWER: "lower is better"}.get(direction, "a diagnostic, neither way better")
