"""Final / best / mean-of-last-K summaries of a run's metric history."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Optional


def guessed_direction(key: str) -> str:
    """For runs written before metrics declared their direction (fl/core/metric_directions.py), whose summary.json has
    no `directions`: the rule by name those runs were summarised with (risks, KL and wall times lower, the rest
    higher). Never used for a run that records its directions."""
    return "min" if any(word in key for word in ("loss", "std", "adaptability", "kl_", "time/")) else "max"


def direction(summary: dict, key: str) -> Optional[str]:
    """'max' (higher is better), 'min' or None (neither; or not declared) for `key`, as the run's summary records it;
    a summary written before directions were recorded: guessed_direction."""
    if "directions" in summary:
        return summary["directions"].get(key)
    return guessed_direction(key)


# accuracy-like metrics (fractions in [0, 1]) by the last part of their name: acc_mean_clients, target_acc,
# client/<i>/acc, target_f1. The report shows them in percent; every other metric (losses, KL, ESS) as logged.
PERCENT_WORDS = ("acc", "f1")


def is_percent(key: str) -> bool:
    return any(word in key.rsplit("/", 1)[-1] for word in PERCENT_WORDS)


def summarize_history(history: list[dict], last_k: int, directions: Optional[Mapping[str, Optional[str]]] = None
                      ) -> dict:
    """For each metric that was logged on evaluation rounds: its final value, best value (and round),
    and mean and std (population, ddof = 0) over the last K evaluations, FedDRM's "mean ± std over the
    last 50 rounds", and how many values that mean took (fewer than K where fewer were logged). Per-client keys
    (client/<i>/...) are left to metrics.jsonl.

    `directions`: each key's 'max' (higher is better), 'min', or None, as the run declared them
    (fl/core/metric_directions.py); a key without one (None, or absent) has no best. They are kept as `directions`.
    Left out (a run read from W&B without them): guessed_direction, the rule of runs written before, and the
    summary has no `directions`."""
    series: dict[str, list[tuple[int, float]]] = {}
    for row in history:
        for key, value in row.items():
            if key == "round" or key.startswith("client/") or not isinstance(value, (int, float)):
                continue
            if isinstance(value, float) and math.isnan(value):
                continue
            series.setdefault(key, []).append((row["round"], float(value)))
    goals = {k: guessed_direction(k) for k in series} if directions is None else {
        k: directions[k] for k in series if k in directions}
    final, best, best_round, last, spread, counted = {}, {}, {}, {}, {}, {}
    for key, points in series.items():
        final[key] = points[-1][1]
        values = [v for _, v in points]
        if goals.get(key) is not None:
            v = max(values) if goals[key] == "max" else min(values)
            best[key], best_round[key] = v, points[values.index(v)][0]
        tail = values[-last_k:]
        last[key], counted[key] = sum(tail) / len(tail), len(tail)
        spread[key] = math.sqrt(sum((v - last[key]) ** 2 for v in tail) / len(tail))
    out = {"final": final, "best": best, "best_round": best_round, f"mean_last_{last_k}": last,
           f"std_last_{last_k}": spread, f"count_last_{last_k}": counted, "last_k": last_k}
    if directions is not None:  # a summary without them reads as guessed, the same again
        out["directions"] = goals
    at_best = {}  # model selection: the test metrics at each validation metric's best round
    for key in (k for k in series if k.startswith("val/") and k in best_round):
        row = next(r for r in history if r["round"] == best_round[key])
        at_best[key] = {"round": best_round[key], **{k: v for k, v in row.items() if k.startswith("test/")}}
    if at_best:
        out["at_best"] = at_best
    if "val/target_acc" in at_best:  # FedPALS' selection on the target validation set, the one shown by default
        out["at_best_val"] = at_best["val/target_acc"]
    return out
