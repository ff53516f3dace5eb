"""Runs grouped by setting and method variant, one run per seed: labels that show only what differs, identical runs
(the same setting, variant and seed, e.g. a command run twice) counted once, and diverged runs in a group of their
own, so that they are never averaged with healthy seeds."""
from __future__ import annotations

import json
from typing import Any, Optional

from fl.report.runs import Run

# keys that never define a setting or a variant: seeds, paths, logging, devices
IGNORED = ("seed", "data.partition.seed", "resume", "logger.", "fabric.", "data.root", "data.download",
           "data.on_device", "data.cache", "trainer.checkpoint_every", "trainer.eval_batch_size",
           "partition_fingerprint")
SEED_KEYS = ("seed", "data.partition.seed")  # ignored for labels, but a run's seed is part of what it repeats
BASE_KEYS = ("data.name", "data.partition.name")  # a setting's dataset/partition: "embedded/dirichlet"
# FedDRM's FedAvg-FT is FedAvg plus local fine-tuning: a row of its own beside FedAvg, in the same setting column
FINETUNE = "finetune.after_round"
DIVERGED_LABEL = " (diverged)"


def _ignored(key: str) -> bool:
    return key.startswith(IGNORED)


def _is_method_key(key: str) -> bool:
    return key.startswith(("method.", "finetune."))


def _varying(runs: list[Run], keys_filter) -> list[str]:
    keys = sorted({k for r in runs for k in r.config if keys_filter(k) and not _ignored(k)})
    return [k for k in keys if len({json.dumps(r.config.get(k), default=str) for r in runs}) > 1]


def _fmt(key: str, value: Any) -> str:
    short = key.split(".", 1)[1] if key.startswith(("method.", "data.", "trainer.", "optim.", "model.")) else key
    return f"{short}={value}"


def method_name(run: Run) -> str:
    return str(run.config.get("method.name", run.summary.get("method", "?")))


def setting_base(run: Run) -> str:
    return "/".join(str(run.config.get(k, "?")) for k in BASE_KEYS)


def label_runs(runs: list[Run]) -> None:
    """Sets each run's method label (name + hyperparameters that vary among that method's runs + its fine-tuning
    rounds, so FedAvg-FT is a row beside FedAvg, + " (diverged)" for a run that diverged) and setting label (only
    what differs between settings: the non-method keys that vary among all runs, with the dataset/partition where
    it varies or nothing else does)."""
    setting_keys = _varying(runs, lambda k: not _is_method_key(k))
    by_method: dict[str, list[Run]] = {}
    for r in runs:
        by_method.setdefault(method_name(r), []).append(r)
    for name, group in by_method.items():
        keys = _varying(group, lambda k: _is_method_key(k) and k not in ("method.name", FINETUNE))
        for r in group:
            ft = [f"+finetune after {r.config[FINETUNE]}"] if r.config.get(FINETUNE) is not None else []
            r.method = " ".join([name] + [_fmt(k, r.config.get(k)) for k in keys] + ft)
            r.method += DIVERGED_LABEL if r.diverged else ""
    base_varies = any(k in BASE_KEYS for k in setting_keys)
    for r in runs:
        extra = [_fmt(k, r.config.get(k)) for k in setting_keys if k not in BASE_KEYS]
        r.setting = " ".join(([setting_base(r)] if base_varies or not extra else []) + extra)


def repeat_identity(run: Run) -> Optional[str]:
    """What makes two runs the same repetition: every key that defines the setting and variant, the method, the seed
    and the partition seed. None for a run without a seed (nothing tells its repetitions apart)."""
    if run.seed is None:
        return None
    items = {k: v for k, v in run.config.items() if not _ignored(k) or k in SEED_KEYS}
    items["method.name"] = method_name(run)
    return json.dumps(sorted(items.items()), default=str)


def _newest_first(run: Run) -> tuple:
    # a run with no known finish time counts as the oldest; equal times fall back on the path, so the pick is stable
    return (run.finished is not None, run.finished or 0.0, run.source)


def drop_repeats(runs: list[Run]) -> list[Run]:
    """One run per (setting, variant, seed): the newest by finish time (summary.json's finished_at, else its
    modification time). Each kept run's `replaces` lists the older ones (newest first), which the tables name."""
    by: dict[Optional[str], list[Run]] = {}
    kept = []
    for r in runs:
        r.replaces = []
        key = repeat_identity(r)
        if key is None:
            kept.append(r)
        else:
            by.setdefault(key, []).append(r)
    for same in by.values():
        same = sorted(same, key=_newest_first, reverse=True)
        same[0].replaces = same[1:]
        kept.append(same[0])
    return kept


def group_runs(runs: list[Run]) -> dict[tuple[str, str], list[Run]]:
    """(setting, method label) -> its runs (one per seed: identical runs counted once), in a stable order."""
    label_runs(runs)
    groups: dict[tuple[str, str], list[Run]] = {}
    for r in sorted(drop_repeats(runs), key=lambda r: (r.setting, r.method, str(r.seed))):
        groups.setdefault((r.setting, r.method), []).append(r)
    return groups


def short_settings(groups: dict) -> dict[str, str]:
    """A plot title for each setting: the fewest of its label's keys that tell it apart from every other setting
    of the report (set values before unset ones), in the label's order; the full label is the plot's caption."""
    first: dict[str, Run] = {}
    for (setting, _), runs in groups.items():
        first.setdefault(setting, runs[0])
    keys = _varying(list(first.values()), lambda k: not _is_method_key(k))
    values = {s: {k: json.dumps(r.config.get(k), default=str) for k in keys} for s, r in first.items()}
    titles = {}
    for setting, mine in values.items():
        others, chosen = [v for s, v in values.items() if s != setting], set()
        while others and len(chosen) < len(keys):
            key = max((k for k in keys if k not in chosen),
                      key=lambda k: (sum(o[k] != mine[k] for o in others), mine[k] != "null", -keys.index(k)))
            chosen.add(key)
            others = [o for o in others if o[key] == mine[key]]
        run = first[setting]
        base = [setting_base(run)] if chosen & set(BASE_KEYS) or not chosen else []
        titles[setting] = " ".join(base + [_fmt(k, run.config.get(k)) for k in keys if k in chosen
                                           and k not in BASE_KEYS])
    return titles
