"""Metric names older runs used, read under today's names, so an old run and a new run of the same method land in
the same column of a report (and a resumed old run continues the same series)."""
from __future__ import annotations

from typing import Any

# old -> new. test/acc_global (micro accuracy of the global model on the pooled test set) and test/global_acc (its
# balanced accuracy, the mean over classes) sat side by side with different values and near-identical names.
_RENAMED = {
    "acc_global": "acc_global_micro",
    "global_acc": "acc_global_balanced",
    "global_acc_client_dist": "acc_global_client_dist",
}
RENAMED = {f"{split}/{old}": f"{split}/{new}" for split in ("test", "val") for old, new in _RENAMED.items()}


def current_name(key: str) -> str:
    """Today's name of a metric key (unchanged when it was never renamed)."""
    return RENAMED.get(key, key)


def current_names(row: dict) -> dict:
    """A metrics row (metrics.jsonl, a W&B history row) with renamed keys under today's names. Where a row holds both
    names (it cannot, from fl.train), today's wins."""
    return {current_name(k): v for k, v in row.items() if not (k in RENAMED and RENAMED[k] in row)}


def current_summary(summary: dict) -> dict:
    """summary.json under today's names: the metric keys of final / best / best_round / mean_last_K / std_last_K /
    at_best (its val/ keys and each one's test/ keys) / at_best_val, and the `headline` metric."""
    def rename(value: Any) -> Any:
        return current_names({k: rename(v) for k, v in value.items()}) if isinstance(value, dict) else value

    out = rename(summary)
    if isinstance(out.get("headline"), str):
        out["headline"] = current_name(out["headline"])
    return out
