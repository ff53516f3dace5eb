"""Final / best / mean-of-last-K summaries of a run's metric history."""
from __future__ import annotations

import math


def higher_is_better(key: str) -> bool:
    # risks, KL and wall times: lower is better
    return not any(word in key for word in ("loss", "std", "adaptability", "kl_", "time/"))


# accuracy-like metrics (fractions in [0, 1]) by the last part of their name: acc_mean_clients, target_acc,
# client/<i>/acc, target_f1. The report shows them in percent; every other metric (losses, KL, ESS) as logged.
PERCENT_WORDS = ("acc", "f1")


def is_percent(key: str) -> bool:
    return any(word in key.rsplit("/", 1)[-1] for word in PERCENT_WORDS)


def summarize_history(history: list[dict], last_k: int) -> dict:
    """For each metric that was logged on evaluation rounds: its final value, best value (and round),
    and mean and std (population, ddof = 0) over the last K evaluations, FedDRM's "mean ± std over the
    last 50 rounds". Per-client keys (client/<i>/...) are left to metrics.jsonl."""
    series: dict[str, list[tuple[int, float]]] = {}
    for row in history:
        for key, value in row.items():
            if key == "round" or key.startswith("client/") or not isinstance(value, (int, float)):
                continue
            if isinstance(value, float) and math.isnan(value):
                continue
            series.setdefault(key, []).append((row["round"], float(value)))
    final, best, best_round, last, spread, counted = {}, {}, {}, {}, {}, {}
    for key, points in series.items():
        final[key] = points[-1][1]
        values = [v for _, v in points]
        v = max(values) if higher_is_better(key) else min(values)
        best[key], best_round[key] = v, points[values.index(v)][0]
        tail = values[-last_k:]
        last[key], counted[key] = sum(tail) / len(tail), len(tail)
        spread[key] = math.sqrt(sum((v - last[key]) ** 2 for v in tail) / len(tail))
    out = {"final": final, "best": best, "best_round": best_round, f"mean_last_{last_k}": last,
           f"std_last_{last_k}": spread, f"count_last_{last_k}": counted, "last_k": last_k}
    at_best = {}  # model selection: the test metrics at each validation metric's best round
    for key in (k for k in series if k.startswith("val/")):
        row = next(r for r in history if r["round"] == best_round[key])
        at_best[key] = {"round": best_round[key], **{k: v for k, v in row.items() if k.startswith("test/")}}
    if at_best:
        out["at_best"] = at_best
    if "val/target_acc" in at_best:  # FedPALS' selection on the target validation set, the one shown by default
        out["at_best_val"] = at_best["val/target_acc"]
    return out
