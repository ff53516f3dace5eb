"""Runs grouped by setting and method, with mean ± std over seeds, as Markdown and LaTeX tables."""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any, Optional

from fl.report.runs import Run
from fl.report.summary import higher_is_better, is_percent

DEFAULT_METRIC = "test/acc_mean_clients"
# keys that never define a setting or a variant: seeds, paths, logging, devices
IGNORED = ("seed", "data.partition.seed", "resume", "logger.", "fabric.", "data.root", "data.download",
           "data.on_device", "trainer.checkpoint_every", "trainer.eval_batch_size", "partition_fingerprint")
BASE_KEYS = ("data.name", "data.partition.name")  # a setting's dataset/partition: "embedded/dirichlet"
# FedDRM's FedAvg-FT is FedAvg plus local fine-tuning: a row of its own beside FedAvg, in the same setting column
FINETUNE = "finetune.after_round"


# ---- grouping ----------------------------------------------------------------------------------------
def _ignored(key: str) -> bool:
    return key.startswith(IGNORED)


def _varying(runs: list[Run], keys_filter) -> list[str]:
    keys = sorted({k for r in runs for k in r.config if keys_filter(k) and not _ignored(k)})
    return [k for k in keys if len({json.dumps(r.config.get(k), default=str) for r in runs}) > 1]


def _fmt(key: str, value: Any) -> str:
    short = key.split(".", 1)[1] if key.startswith(("method.", "data.", "trainer.", "optim.", "model.")) else key
    return f"{short}={value}"


def setting_base(run: Run) -> str:
    return "/".join(str(run.config.get(k, "?")) for k in BASE_KEYS)


def label_runs(runs: list[Run]) -> None:
    """Sets each run's method label (name + hyperparameters that vary among that method's runs + its fine-tuning
    rounds, so FedAvg-FT is a row beside FedAvg) and setting label (only what differs between settings: the
    non-method keys that vary among all runs, with the dataset/partition where it varies or nothing else does)."""
    setting_keys = _varying(runs, lambda k: not k.startswith(("method.", "finetune.")))
    by_method: dict[str, list[Run]] = {}
    for r in runs:
        by_method.setdefault(str(r.config.get("method.name", r.summary.get("method", "?"))), []).append(r)
    for name, group in by_method.items():
        keys = _varying(group, lambda k: k.startswith(("method.", "finetune.")) and k not in ("method.name", FINETUNE))
        for r in group:
            ft = [f"+finetune after {r.config[FINETUNE]}"] if r.config.get(FINETUNE) is not None else []
            r.method = " ".join([name] + [_fmt(k, r.config.get(k)) for k in keys] + ft)
    base_varies = any(k in BASE_KEYS for k in setting_keys)
    for r in runs:
        extra = [_fmt(k, r.config.get(k)) for k in setting_keys if k not in BASE_KEYS]
        r.setting = " ".join(([setting_base(r)] if base_varies or not extra else []) + extra)


def group_runs(runs: list[Run]) -> dict[tuple[str, str], list[Run]]:
    """(setting, method label) -> its runs (one per seed), in a stable order."""
    label_runs(runs)
    groups: dict[tuple[str, str], list[Run]] = {}
    for r in sorted(runs, key=lambda r: (r.setting, r.method, str(r.seed))):
        groups.setdefault((r.setting, r.method), []).append(r)
    return groups


def setting_headlines(groups: dict) -> dict[str, list[str]]:
    """Each setting's headline metrics: those of the paper methods run on it, else the default."""
    out: dict[str, list[str]] = {}
    for (setting, _), runs in groups.items():
        headline = runs[0].headline
        if headline and headline not in out.setdefault(setting, []):
            out[setting].append(headline)
    for (setting, _), runs in groups.items():
        if not out.setdefault(setting, []):  # no paper method here: a target setting is read on the target
            targeted = any("test/target_acc" in r.summary.get("final", {}) for r in runs)
            out[setting].append("test/target_acc" if targeted else DEFAULT_METRIC)
    return out


# ---- statistics and tables ---------------------------------------------------------------------------
def mean_std(values: list[float]) -> tuple[Optional[float], Optional[float], int]:
    """Mean and sample standard deviation (ddof = 1) over seeds; std is None for a single seed."""
    values = [v for v in values if v is not None]
    if not values:
        return None, None, 0
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else None), len(values)


def table_rows(groups: dict, metrics: list[str]) -> list[dict]:
    """One row per (setting, method): seeds, and for each metric final / last-K / best-val statistics."""
    heads = setting_headlines(groups)
    rows = []
    for (setting, method), runs in groups.items():
        headline = runs[0].headline or heads[setting][0]
        row = {"setting": setting, "method": method, "seeds": [r.seed for r in runs], "headline": headline,
               "last_k": sorted({r.summary.get("last_k") for r in runs}), "cells": {}}
        for metric in dict.fromkeys([headline] + metrics):
            row["cells"][metric] = {
                "final": mean_std([r.summary.get("final", {}).get(metric) for r in runs]),
                "last": mean_std([r.last(metric) for r in runs]),
                "best_val": mean_std([r.summary.get("at_best_val", {}).get(metric) for r in runs]),
            }
        rows.append(row)
    return rows


def model_selection(groups: dict, val: str = "val/target_acc") -> list[dict]:
    """The papers' model selection over a hyperparameter grid (FedPALS' lambda): for each (setting, method) and
    seed, the variant whose best validation value (`val`) is highest, and its test metrics at that round
    (summary.json's at_best_val); mean ± std over seeds. Only methods run with several variants that log `val`."""
    by: dict[tuple[str, str], dict[Any, list[Run]]] = {}
    for (setting, _), runs in groups.items():
        for r in runs:
            if val in r.summary.get("best", {}):
                name = str(r.config.get("method.name", r.summary.get("method", "?")))
                by.setdefault((setting, name), {}).setdefault(r.seed, []).append(r)
    rows = []
    for (setting, name), seeds in by.items():
        if len({r.method for rs in seeds.values() for r in rs}) < 2:
            continue
        chosen = {seed: max(rs, key=lambda r: r.summary["best"][val]) for seed, rs in seeds.items()}
        at = {seed: _at_best(r, val) for seed, r in chosen.items()}
        keys = sorted({k for a in at.values() for k in a if k.startswith("test/")})
        rows.append({"setting": setting, "method": name, "seeds": sorted(chosen, key=str), "val": val,
                     "chosen": [chosen[seed].method for seed in sorted(chosen, key=str)],
                     "cells": {k: mean_std([a.get(k) for a in at.values()]) for k in keys}})
    return rows


def _at_best(run: Run, val: str) -> dict:
    """The run's test metrics at the round of its best `val` (summaries written before `at_best` existed kept
    only the target's)."""
    at = run.summary.get("at_best", {})
    return at[val] if val in at else run.summary.get("at_best_val", {}) if val == "val/target_acc" else {}


def model_selection_table(rows: list[dict]) -> str:
    """The model-selected results as Markdown: one row per (setting, method), the variants chosen per seed."""
    if not rows:
        return ""
    keys = sorted({k for r in rows for k in r["cells"]})
    bold = bold_cells(rows, [(k, None) for k in keys])
    head = ["setting", "method", "seeds", *keys, "chosen (per seed)"]
    lines = [f"Selected per seed on the best {rows[0]['val']} over the method's variants; test metrics at that "
             "round, mean ± sample std over seeds.", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, r in enumerate(rows):
        counts = {v: r["chosen"].count(v) for v in dict.fromkeys(r["chosen"])}
        chosen = ", ".join(f"{v} ({n}x)" for v, n in counts.items())
        cells = [r["setting"], r["method"], str(len(r["seeds"])),
                 *[fmt_stat(r["cells"][k], k, bold=(i, k, None) in bold) if k in r["cells"] else "—" for k in keys],
                 chosen]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _scale(metric: str) -> tuple[float, int]:
    """Factor and decimals a metric is shown with: accuracies in percent ("91.5"), the rest as logged."""
    return (100.0, 1) if is_percent(metric) else (1.0, 4)


def fmt_stat(stat: tuple, metric: str = "", latex: bool = False, bold: bool = False) -> str:
    """mean ± std of `metric` (accuracies in percent); bold as Markdown's **x** or LaTeX's \\mathbf."""
    mean, std, n = stat
    if n == 0:
        return "--" if latex else "—"
    scale, digits = _scale(metric)
    pm = " \\pm " if latex else " ± "
    text = f"{mean * scale:.{digits}f}" + ("" if std is None else f"{pm}{std * scale:.{digits}f}")
    if latex:
        return f"$\\mathbf{{{text}}}$" if bold else f"${text}$"
    return f"**{text}**" if bold else text


def cell_stat(row: dict, metric: str, stat: Optional[str] = None) -> Optional[tuple]:
    """A row's (mean, std, n) of `metric`'s statistic (final / last / best_val; model-selection rows have only
    one: stat None); None where no seed has a value."""
    cell = row["cells"].get(metric)
    if cell is not None and stat is not None:
        cell = cell[stat]
    return cell if cell and cell[2] else None


def compared_rows(rows: list[dict]) -> list[list[int]]:
    """The groups of rows a column's best is picked among: the methods of each setting (different data are not
    compared); when every setting has one row (a sweep over a data or trainer key), the whole column."""
    by: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by.setdefault(r["setting"], []).append(i)
    return list(by.values()) if any(len(b) > 1 for b in by.values()) else [list(range(len(rows)))]


def bold_cells(rows: list[dict], cols: list[tuple[str, Optional[str]]]) -> set[tuple[int, str, Optional[str]]]:
    """(row index, metric, statistic) of each column's best mean, by the metric's goal (higher is better but for
    losses, std, KL and adaptability). Compared as shown, so equal-looking values are all bold; a column whose
    values all look the same has none."""
    best = set()
    for metric, stat in cols:
        scale, digits = _scale(metric)
        for block in compared_rows(rows):
            shown = {i: round(c[0] * scale, digits) for i in block if (c := cell_stat(rows[i], metric, stat))}
            if len(set(shown.values())) > 1:
                top = (max if higher_is_better(metric) else min)(shown.values())
                best |= {(i, metric, stat) for i, v in shown.items() if v == top}
    return best


def columns(rows: list[dict], metrics: list[str]) -> list[tuple[str, str, str]]:
    """(metric, statistic, header) for every column with at least one value."""
    k = "/".join(str(x) for r in rows for x in r["last_k"]) if len({x for r in rows for x in r["last_k"]}) > 1 \
        else str(rows[0]["last_k"][0])
    cols = []
    for metric in metrics:
        for stat, head in (("final", "final"), ("last", f"last {k}"), ("best_val", "@best val")):
            if any(metric in r["cells"] and r["cells"][metric][stat][2] for r in rows):
                cols.append((metric, stat, f"{metric} {head}"))
    return cols


def markdown_table(rows: list[dict], metrics: list[str]) -> str:
    cols = columns(rows, metrics)
    bold = bold_cells(rows, [(m, s) for m, s, _ in cols])
    head = ["setting", "method", "seeds", "headline (final)"] + [c[2] for c in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, r in enumerate(rows):
        cells = [r["setting"], r["method"], str(len(r["seeds"])),
                 f"{r['headline']}: {fmt_stat(r['cells'][r['headline']]['final'], r['headline'])}"]
        cells += [fmt_stat(r["cells"][m][s], m, bold=(i, m, s) in bold) if m in r["cells"] else "—"
                  for m, s, _ in cols]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


TEX_ESCAPES = {"\\": "\\textbackslash{}", "_": "\\_", "%": "\\%", "&": "\\&", "#": "\\#", "{": "\\{",
               "}": "\\}", "$": "\\$", "~": "\\textasciitilde{}", "^": "\\textasciicircum{}"}


def _tex(text: str) -> str:
    return "".join(TEX_ESCAPES.get(c, c) for c in text)


def latex_table(rows: list[dict], metrics: list[str]) -> str:
    cols = columns(rows, metrics)
    bold = bold_cells(rows, [(m, s) for m, s, _ in cols])
    head = ["Setting", "Method", "$n$", "Headline (final)"] + [_tex(c[2]) for c in cols]
    lines = ["% mean $\\pm$ sample std over seeds; needs \\usepackage{booktabs}",
             "\\begin{tabular}{" + "ll" + "r" * (len(head) - 2) + "}", "\\toprule",
             " & ".join(head) + " \\\\", "\\midrule"]
    for i, r in enumerate(rows):
        cells = [_tex(r["setting"]), _tex(r["method"]), str(len(r["seeds"])),
                 f"{_tex(r['headline'])}: {fmt_stat(r['cells'][r['headline']]['final'], r['headline'], latex=True)}"]
        cells += [fmt_stat(r["cells"][m][s], m, latex=True, bold=(i, m, s) in bold) if m in r["cells"] else "--"
                  for m, s, _ in cols]
        lines.append(" & ".join(cells) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


def default_metrics(groups: dict, extra: Optional[list[str]] = None) -> list[str]:
    """The settings' headline metrics, the sweep's metric(s) and the mean client accuracy."""
    heads = setting_headlines(groups)
    return list(dict.fromkeys([m for ms in heads.values() for m in ms] + (extra or []) + [DEFAULT_METRIC]))


def load_sweeps(paths: list) -> list[dict]:
    """The sweep.json of each sweep directory among `paths`: fl.sweep's points (params, per-seed values),
    metric, goal and best point."""
    return [json.loads(m.read_text()) for m in (Path(p) / "sweep.json" for p in paths) if m.is_file()]


def sweep_metrics(paths: list) -> list[str]:
    """The metric of each sweep directory among `paths`."""
    return [s["metric"] for s in load_sweeps(paths) if s.get("metric")]
