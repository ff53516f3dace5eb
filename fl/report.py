"""Compare runs: Markdown and LaTeX tables (method x setting, mean ± std over seeds), PNG plots, one HTML page.

    python -m fl.report RUN_DIR|SWEEP_DIR [...] [--out DIR] [--metrics k1,k2] [--no-plots]
    python -m fl.report --wandb ENTITY/PROJECT [--filter '{"group": "sweep-X"}'] [--out DIR]

Runs are read from their run directories (config.yaml, summary.json, metrics.jsonl), or from W&B's API
(config and history; the summary is recomputed from the history the same way fl.train writes
summary.json). Runs that differ only in their seed are one group. Within a method, the hyperparameters
that differ between its runs name the variant (e.g. "fedprox mu=0.1"); other keys that differ between
runs name the setting (e.g. "embedded/dirichlet dirichlet_alpha=0.1"). Exit codes: 0 written, 2 bad input.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

from fl.metrics.summary import summarize_history

DEFAULT_METRIC = "test/acc_mean_clients"
# the number each paper leads with (shared/specs); other methods are read on the setting's headline
HEADLINE = {"fedpals": "test/target_acc", "feddrm": "test/system_acc", "fedmosaic": "test/acc_mean_clients",
            "pfedfda": "test/acc_weighted", "fedacd": "test/global_acc"}
# keys that never define a setting or a variant: seeds, paths, logging, devices
IGNORED = ("seed", "data.partition_seed", "resume", "logger.", "fabric.", "data.root", "data.download",
           "data.on_device", "trainer.checkpoint_every", "trainer.eval_batch_size", "partition_fingerprint")


class ReportError(ValueError):
    """Bad input to the report; the message is one line."""


def headline_metric(method: str) -> str:
    return HEADLINE.get(method, DEFAULT_METRIC)


@dataclass
class Run:
    name: str
    source: str
    config: dict            # flattened: "method.name" -> "fedprox"
    summary: dict           # as in summary.json: final / best / best_round / mean_last_K / last_k
    history: list = field(default_factory=list)  # metrics.jsonl rows
    method: str = ""        # label: method name plus the hyperparameters that vary within it
    setting: str = ""

    @property
    def seed(self) -> Any:
        return self.config.get("seed")

    def last(self, metric: str) -> Optional[float]:
        return self.summary.get(f"mean_last_{self.summary.get('last_k')}", {}).get(metric)

    def series(self, key: str) -> list[tuple[int, float]]:
        return [(r["round"], float(r[key])) for r in self.history
                if isinstance(r.get(key), (int, float)) and not math.isnan(r[key])]


def flatten(d: Any, prefix: str = "") -> dict:
    if isinstance(d, dict):
        out = {}
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): d}


# ---- loading ---------------------------------------------------------------------------------------
def load_run_dir(path: Path) -> Run:
    config = flatten(OmegaConf.to_container(OmegaConf.load(path / "config.yaml")))
    summary = json.loads((path / "summary.json").read_text())
    metrics = path / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.is_file() else []
    history = [json.loads(line) for line in lines if line.strip()]
    return Run(path.name, str(path), config, summary, history)


def load_local(paths: list[str | Path]) -> tuple[list[Run], list[str]]:
    """Run directories, or folders holding them (a sweep directory, outputs/); returns runs and notes
    about directories that have no summary.json (unfinished runs)."""
    runs, notes, seen = [], [], set()
    for p in map(Path, paths):
        if not p.is_dir():
            raise ReportError(f"{p}: not a directory (expected a run directory or a folder of runs)")
        found = [p] if (p / "summary.json").is_file() else sorted(s.parent for s in p.rglob("summary.json"))
        pending = [c.parent for c in p.rglob("config.yaml") if not (c.parent / "summary.json").is_file()]
        notes += [f"skipped {d}: no summary.json (unfinished run)" for d in sorted(pending)]
        for d in found:
            if d.resolve() not in seen and (d / "config.yaml").is_file():
                seen.add(d.resolve())
                runs.append(load_run_dir(d))
    if not runs:
        raise ReportError(f"no finished runs (run directories with summary.json) under {', '.join(map(str, paths))}")
    return runs, notes


def load_wandb(project: str, filters: Optional[dict] = None, api: Any = None) -> list[Run]:
    """Finished runs of a W&B project (entity/project) through wandb.Api; per round, the history rows
    logged at the same trainer/global_step are merged into one metrics.jsonl-like row."""
    if project.count("/") != 1:
        raise ReportError(f"--wandb {project!r}: expected ENTITY/PROJECT")
    if api is None:
        from fl.loggers import wandb_mode

        if wandb_mode("auto") != "online":
            raise ReportError("--wandb needs W&B online: no API key (set WANDB_API_KEY or run `wandb login`) or "
                              "WANDB_MODE forces offline; use run directories instead")
        try:
            import wandb

            api = wandb.Api(timeout=30)
        except Exception as err:  # the W&B client failing to start is reported in one line
            raise ReportError(f"--wandb {project}: cannot reach W&B: {str(err).splitlines()[0]}") from None
    try:
        remote = [r for r in api.runs(project, filters=filters or {}) if r.state == "finished"]
        runs = []
        for r in remote:
            config = flatten({k: v for k, v in dict(r.config).items() if not k.startswith("_")})
            rows: dict[int, dict] = {}
            for row in r.scan_history():
                step = row.get("trainer/global_step")
                if step is None:
                    continue
                merged = rows.setdefault(int(step), {"round": int(step)})
                merged.update({k: v for k, v in row.items() if not k.startswith(("_", "trainer/"))
                               and isinstance(v, (int, float)) and not isinstance(v, bool)})
            history = [rows[k] for k in sorted(rows)]
            summary = summarize_history(history, int(config.get("trainer.last_k", 5)))
            runs.append(Run(r.name, getattr(r, "url", r.name), config, summary, history))
    except ReportError:
        raise
    except Exception as err:  # network and permission errors end in one line, not a traceback
        raise ReportError(f"--wandb {project}: {type(err).__name__}: {str(err).splitlines()[0]}") from None
    if not runs:
        raise ReportError(f"--wandb {project}: no finished runs{' matching the filter' if filters else ''}")
    return runs


# ---- grouping ----------------------------------------------------------------------------------------
def _ignored(key: str) -> bool:
    return key.startswith(IGNORED)


def _varying(runs: list[Run], keys_filter) -> list[str]:
    keys = sorted({k for r in runs for k in r.config if keys_filter(k) and not _ignored(k)})
    return [k for k in keys if len({json.dumps(r.config.get(k), default=str) for r in runs}) > 1]


def _fmt(key: str, value: Any) -> str:
    short = key.split(".", 1)[1] if key.startswith(("method.", "data.", "trainer.", "optim.", "model.")) else key
    return f"{short}={value}"


def label_runs(runs: list[Run]) -> None:
    """Sets each run's method label (name + hyperparameters that vary among that method's runs) and
    setting label (dataset/partition + other keys that vary among all runs)."""
    setting_keys = _varying(runs, lambda k: not k.startswith("method."))
    by_method: dict[str, list[Run]] = {}
    for r in runs:
        by_method.setdefault(str(r.config.get("method.name", r.summary.get("method", "?"))), []).append(r)
    for name, group in by_method.items():
        keys = _varying(group, lambda k: k.startswith("method.") and k != "method.name")
        for r in group:
            r.method = " ".join([name] + [_fmt(k, r.config.get(k)) for k in keys])
    for r in runs:
        base = f"{r.config.get('data.name', '?')}/{r.config.get('data.partition', '?')}"
        extra = [_fmt(k, r.config.get(k)) for k in setting_keys if k not in ("data.name", "data.partition")]
        r.setting = " ".join([base] + extra)


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
        name = str(runs[0].config.get("method.name"))
        if name in HEADLINE and HEADLINE[name] not in out.setdefault(setting, []):
            out[setting].append(HEADLINE[name])
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
        name = str(runs[0].config.get("method.name"))
        headline = HEADLINE.get(name) or heads[setting][0]
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


def fmt_stat(stat: tuple, latex: bool = False, digits: int = 4) -> str:
    mean, std, n = stat
    if n == 0:
        return "--" if latex else "—"
    if std is None:
        return f"${mean:.{digits}f}$" if latex else f"{mean:.{digits}f}"
    return f"${mean:.{digits}f} \\pm {std:.{digits}f}$" if latex else f"{mean:.{digits}f} ± {std:.{digits}f}"


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
    head = ["setting", "method", "seeds", "headline (final)"] + [c[2] for c in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["setting"], r["method"], str(len(r["seeds"])),
                 f"{r['headline']}: {fmt_stat(r['cells'][r['headline']]['final'])}"]
        cells += [fmt_stat(r["cells"][m][s]) if m in r["cells"] else "—" for m, s, _ in cols]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


TEX_ESCAPES = {"\\": "\\textbackslash{}", "_": "\\_", "%": "\\%", "&": "\\&", "#": "\\#", "{": "\\{",
               "}": "\\}", "$": "\\$", "~": "\\textasciitilde{}", "^": "\\textasciicircum{}"}


def _tex(text: str) -> str:
    return "".join(TEX_ESCAPES.get(c, c) for c in text)


def latex_table(rows: list[dict], metrics: list[str]) -> str:
    cols = columns(rows, metrics)
    head = ["Setting", "Method", "$n$", "Headline (final)"] + [_tex(c[2]) for c in cols]
    lines = ["% mean $\\pm$ sample std over seeds; needs \\usepackage{booktabs}",
             "\\begin{tabular}{" + "ll" + "r" * (len(head) - 2) + "}", "\\toprule",
             " & ".join(head) + " \\\\", "\\midrule"]
    for r in rows:
        cells = [_tex(r["setting"]), _tex(r["method"]), str(len(r["seeds"])),
                 f"{_tex(r['headline'])}: {fmt_stat(r['cells'][r['headline']]['final'], latex=True)}"]
        cells += [fmt_stat(r["cells"][m][s], latex=True) if m in r["cells"] else "--" for m, s, _ in cols]
        lines.append(" & ".join(cells) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


def default_metrics(groups: dict, extra: Optional[list[str]] = None) -> list[str]:
    """The settings' headline metrics, the sweep's metric(s) and the mean client accuracy."""
    heads = setting_headlines(groups)
    return list(dict.fromkeys([m for ms in heads.values() for m in ms] + (extra or []) + [DEFAULT_METRIC]))


def sweep_metrics(paths: list) -> list[str]:
    """The metric of each sweep directory among `paths` (from the runner's sweep.json)."""
    found = []
    for p in map(Path, paths):
        manifest = p / "sweep.json"
        if manifest.is_file():
            metric = json.loads(manifest.read_text()).get("metric")
            if metric:
                found.append(metric)
    return found


# ---- the report ----------------------------------------------------------------------------------------
def write_report(runs: list[Run], out: Path, metrics: Optional[list[str]] = None, plots: bool = True,
                 title: str = "Comparison", notes: Optional[list[str]] = None,
                 extra_metrics: Optional[list[str]] = None) -> dict[str, Path]:
    """report.md, report.tex, plots/*.png and report.html (self-contained) in `out`."""
    groups = group_runs(runs)
    metrics = metrics or default_metrics(groups, extra_metrics)
    rows = table_rows(groups, metrics)
    out.mkdir(parents=True, exist_ok=True)
    md = markdown_table(rows, metrics)
    figures = []
    if plots:
        from fl.report_plots import all_figures

        figures = all_figures(groups, metrics, out / "plots")
    k = ", ".join(sorted({str(x) for r in rows for x in r["last_k"]}))
    caption = (f"Mean ± sample std over seeds. final: the last evaluation; last {k}: the mean over the last {k} "
               "evaluations; @best val: at the round with the best target validation accuracy.")
    lines = [f"# {title}", "", caption, "", md]
    lines += [f"![{name}](plots/{p.name})" for name, p in figures]
    if notes:
        lines += ["", *[f"- {n}" for n in notes]]
    paths = {"markdown": out / "report.md", "latex": out / "report.tex", "html": out / "report.html"}
    paths["markdown"].write_text("\n".join(lines) + "\n")
    paths["latex"].write_text(latex_table(rows, metrics))
    from fl.report_html import html_page

    paths["html"].write_text(html_page(title, caption, rows, columns(rows, metrics), figures, notes or []))
    return paths


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fl.report", description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="*", help="run directories or folders of runs (e.g. a sweep directory)")
    p.add_argument("--wandb", metavar="ENTITY/PROJECT", help="read finished runs from W&B instead (online)")
    p.add_argument("--filter", help="--wandb: a W&B API filter as JSON, e.g. '{\"group\": \"sweep-X\"}'")
    p.add_argument("--out", help="output folder (default: <the one input folder>/report, else outputs/report)")
    p.add_argument("--metrics", help="comma-separated metric keys (default: the settings' headline metrics "
                   f"and {DEFAULT_METRIC})")
    p.add_argument("--title", default="Comparison")
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    try:
        if bool(args.paths) == bool(args.wandb):
            raise ReportError("give run directories or --wandb ENTITY/PROJECT (one of the two)")
        notes = []
        if args.wandb:
            try:
                filters = json.loads(args.filter) if args.filter else None
            except json.JSONDecodeError as err:
                raise ReportError(f"--filter: not JSON ({err})") from None
            runs = load_wandb(args.wandb, filters)
        else:
            runs, notes = load_local(args.paths)
        out = Path(args.out) if args.out else (Path(args.paths[0]) / "report" if len(args.paths) == 1
                                               and not (Path(args.paths[0]) / "summary.json").is_file()
                                               else Path("outputs") / "report")
        metrics = args.metrics.split(",") if args.metrics else None
        paths = write_report(runs, out, metrics, plots=not args.no_plots, title=args.title, notes=notes,
                             extra_metrics=sweep_metrics(args.paths or []))
    except ReportError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(paths["markdown"].read_text().split("\n\n![")[0].strip())
    print(f"\nwrote {', '.join(str(p) for p in paths.values())} ({len(runs)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
