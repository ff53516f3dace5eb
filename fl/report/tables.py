"""Grouped runs (fl/report/groups.py) as tables: mean ± std over seeds, in Markdown and LaTeX, with footnotes for
seeds run more than once and for runs that diverged."""
from __future__ import annotations

import math
import statistics
from typing import Any, Optional

from fl.report.groups import method_name
from fl.report.marks import DIVERGED, TEX_MARKS, diverged_facts, footnotes, repeat_facts, row_marks
from fl.report.runs import Run
from fl.report.summary import direction, guessed_direction, is_percent

DEFAULT_METRIC = "test/acc_mean_clients"


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
    spread = len(values) > 1 and all(math.isfinite(v) for v in values)  # an infinite value (lambda) has none
    return statistics.mean(values), (statistics.stdev(values) if spread else None), len(values)


def table_rows(groups: dict, metrics: list[str]) -> list[dict]:
    """One row per (setting, method): seeds, and for each metric final / last-K / best-val statistics; `repeats`
    and `diverged` hold what the row's marks explain (fl/report/marks.py)."""
    heads = setting_headlines(groups)
    rows = []
    for (setting, method), runs in groups.items():
        headline = runs[0].headline or heads[setting][0]
        row = {"setting": setting, "method": method, "seeds": [r.seed for r in runs], "headline": headline,
               "last_k": sorted({r.summary.get("last_k") for r in runs}), "cells": {},
               "repeats": repeat_facts(runs), "diverged": diverged_facts(runs), "directions": {}}
        for metric in dict.fromkeys([headline] + metrics):
            row["directions"][metric] = runs_direction(runs, metric)
            row["cells"][metric] = {
                "final": mean_std([r.summary.get("final", {}).get(metric) for r in runs]),
                "last": mean_std([r.last(metric) for r in runs]),
                "best_val": mean_std([r.summary.get("at_best_val", {}).get(metric) for r in runs]),
            }
        rows.append(row)
    return rows


def runs_direction(runs: list[Run], metric: str) -> Optional[str]:
    """'max', 'min' or None for `metric`, as the runs' summaries record it (the first run that has it)."""
    return next((direction(r.summary, metric) for r in runs if metric in r.summary.get("final", {})),
                guessed_direction(metric) if not any("directions" in r.summary for r in runs) else None)


def model_selection(groups: dict, val: str = "val/target_acc") -> list[dict]:
    """The papers' model selection over a hyperparameter grid (FedPALS' lambda): for each (setting, method) and
    seed, the variant whose best validation value (`val`) is best (highest, or lowest for a metric declared lower
    is better), and its test metrics at that round (summary.json's at_best_val); mean ± std over seeds. Only methods
    run with several variants that log `val`. Runs that diverged are not candidates (the row's `diverged` names
    them)."""
    by: dict[tuple[str, str], dict[Any, list[Run]]] = {}
    left_out: dict[tuple[str, str], list[Run]] = {}
    for (setting, _), runs in groups.items():
        for r in runs:
            if val in r.summary.get("best", {}):
                key = (setting, method_name(r))
                if r.diverged:
                    left_out.setdefault(key, []).append(r)
                else:
                    by.setdefault(key, {}).setdefault(r.seed, []).append(r)
    rows = []
    for (setting, name), seeds in by.items():
        if len({r.method for rs in seeds.values() for r in rs}) < 2:
            continue
        pick = min if runs_direction([r for rs in seeds.values() for r in rs], val) == "min" else max
        chosen = {seed: pick(rs, key=lambda r: r.summary["best"][val]) for seed, rs in seeds.items()}
        at = {seed: _at_best(r, val) for seed, r in chosen.items()}
        keys = sorted({k for a in at.values() for k in a if k.startswith("test/")})
        runs = list(chosen.values())
        rows.append({"setting": setting, "method": name, "seeds": sorted(chosen, key=str), "val": val,
                     "directions": {k: runs_direction(runs, k) for k in keys},
                     "chosen": [chosen[seed].method for seed in sorted(chosen, key=str)],
                     "cells": {k: mean_std([a.get(k) for a in at.values()]) for k in keys},
                     "repeats": repeat_facts([r for rs in seeds.values() for r in rs]),
                     "diverged": diverged_facts(left_out.get((setting, name), []))})
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
        cells = [r["setting"], r["method"], f"{len(r['seeds'])}{row_marks(r)}",
                 *[fmt_stat(r["cells"][k], k, bold=(i, k, None) in bold) if k in r["cells"] else "—" for k in keys],
                 chosen]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines + _markdown_notes(footnotes(rows, selection=True))) + "\n"


def _markdown_notes(notes: list[tuple[str, str]]) -> list[str]:
    return ["", *[f"{mark} {text}" for mark, text in notes]] if notes else []


def _scale(metric: str) -> tuple[float, int]:
    """Factor and decimals a metric is shown with: accuracies in percent ("91.5"), the rest as logged."""
    return (100.0, 1) if is_percent(metric) else (1.0, 4)


def fmt_stat(stat: tuple, metric: str = "", latex: bool = False, bold: bool = False, mark: str = "") -> str:
    """mean ± std of `metric` (accuracies in percent); bold as Markdown's **x** or LaTeX's \\mathbf; `mark` (a
    footnote's mark, fl/report/marks.py) after the number."""
    mean, std, n = stat
    if n == 0:
        return "--" if latex else "—"
    scale, digits = _scale(metric)
    pm = " \\pm " if latex else " ± "
    text = f"{mean * scale:.{digits}f}" + ("" if std is None else f"{pm}{std * scale:.{digits}f}")
    if latex:
        return (f"$\\mathbf{{{text}}}" if bold else f"${text}") + "".join(f"^{{{TEX_MARKS[m]}}}" for m in mark) + "$"
    return (f"**{text}**" if bold else text) + mark


def cell_stat(row: dict, metric: str, stat: Optional[str] = None) -> Optional[tuple]:
    """A row's (mean, std, n) of `metric`'s statistic (final / last / best_val; model-selection rows have only
    one: stat None); None where no seed has a value."""
    cell = row["cells"].get(metric)
    if cell is not None and stat is not None:
        cell = cell[stat]
    return cell if cell and cell[2] else None


def compared_rows(rows: list[dict]) -> list[list[int]]:
    """The groups of rows a column's best is picked among: the methods of each setting (different data are not
    compared); when every setting has one row (a sweep over a data or trainer key), the whole column. Rows of
    runs that diverged are not ranked."""
    by: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        if not r.get("diverged") or "chosen" in r:  # a model-selection row's diverged runs were left out of it
            by.setdefault(r["setting"], []).append(i)
    return list(by.values()) if any(len(b) > 1 for b in by.values()) else [[i for b in by.values() for i in b]]


def bold_cells(rows: list[dict], cols: list[tuple[str, Optional[str]]]) -> set[tuple[int, str, Optional[str]]]:
    """(row index, metric, statistic) of each column's best mean, by the direction the runs declared for the metric
    (summary.json's directions; a metric declared neither way better has none). Compared as shown, so equal-looking
    values are all bold; a column whose values all look the same has none."""
    best = set()
    for metric, stat in cols:
        scale, digits = _scale(metric)
        for block in compared_rows(rows):
            goal = next((rows[i]["directions"][metric] for i in block if metric in rows[i].get("directions", {})),
                        guessed_direction(metric))
            shown = {i: round(c[0] * scale, digits) for i in block if (c := cell_stat(rows[i], metric, stat))}
            if goal is not None and len(set(shown.values())) > 1:
                top = (max if goal == "max" else min)(shown.values())
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


def cell_mark(row: dict) -> str:
    """The mark on each value of a row: † on a row of runs that diverged."""
    return DIVERGED if row.get("diverged") and "chosen" not in row else ""


def markdown_table(rows: list[dict], metrics: list[str]) -> str:
    """The table, then a footnote for each mark it carries."""
    cols = columns(rows, metrics)
    bold = bold_cells(rows, [(m, s) for m, s, _ in cols])
    head = ["setting", "method", "seeds", "headline (final)"] + [c[2] for c in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, r in enumerate(rows):
        mark = cell_mark(r)
        cells = [r["setting"], r["method"], f"{len(r['seeds'])}{row_marks(r)}",
                 f"{r['headline']}: {fmt_stat(r['cells'][r['headline']]['final'], r['headline'], mark=mark)}"]
        cells += [fmt_stat(r["cells"][m][s], m, bold=(i, m, s) in bold, mark=mark) if m in r["cells"] else "—"
                  for m, s, _ in cols]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines + _markdown_notes(footnotes(rows))) + "\n"


TEX_ESCAPES = {"\\": "\\textbackslash{}", "_": "\\_", "%": "\\%", "&": "\\&", "#": "\\#", "{": "\\{",
               "}": "\\}", "$": "\\$", "~": "\\textasciitilde{}", "^": "\\textasciicircum{}"}


def _tex(text: str) -> str:
    return "".join(TEX_ESCAPES.get(c, c) for c in text)


def latex_table(rows: list[dict], metrics: list[str]) -> str:
    """The table (booktabs), then a footnote for each mark it carries."""
    cols = columns(rows, metrics)
    bold = bold_cells(rows, [(m, s) for m, s, _ in cols])
    head = ["Setting", "Method", "$n$", "Headline (final)"] + [_tex(c[2]) for c in cols]
    lines = ["% mean $\\pm$ sample std over seeds; needs \\usepackage{booktabs}",
             "\\begin{tabular}{" + "ll" + "r" * (len(head) - 2) + "}", "\\toprule",
             " & ".join(head) + " \\\\", "\\midrule"]
    for i, r in enumerate(rows):
        mark, marks = cell_mark(r), row_marks(r)
        n = str(len(r["seeds"])) + (f"$^{{{''.join(TEX_MARKS[m] for m in marks)}}}$" if marks else "")
        headline = fmt_stat(r['cells'][r['headline']]['final'], r['headline'], latex=True, mark=mark)
        cells = [_tex(r["setting"]), _tex(r["method"]), n, f"{_tex(r['headline'])}: {headline}"]
        cells += [fmt_stat(r["cells"][m][s], m, latex=True, bold=(i, m, s) in bold, mark=mark)
                  if m in r["cells"] else "--" for m, s, _ in cols]
        lines.append(" & ".join(cells) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    lines += [f"\\par{{\\footnotesize ${TEX_MARKS[mark]}$~{_tex(text)}}}" for mark, text in footnotes(rows)]
    return "\n".join(lines) + "\n"


def default_metrics(groups: dict, extra: Optional[list[str]] = None) -> list[str]:
    """The settings' headline metrics, the sweep's metric(s) and the mean client accuracy."""
    heads = setting_headlines(groups)
    return list(dict.fromkeys([m for ms in heads.values() for m in ms] + (extra or []) + [DEFAULT_METRIC]))
