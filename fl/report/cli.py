"""Compare runs: Markdown and LaTeX tables (method x setting, mean ± std over seeds), PNG plots, one HTML page.

    python -m fl.report RUN_DIR|SWEEP_DIR [...] [--out DIR] [--metrics k1,k2] [--no-plots]
    python -m fl.report --wandb ENTITY/PROJECT [--filter '{"group": "sweep-X"}'] [--out DIR]

Runs are read from their run directories (config.yaml, summary.json, metrics.jsonl), or from W&B's API
(config and history; the summary is recomputed from the history the same way fl.train writes
summary.json). Runs that differ only in their seed are one group; runs of the same setting, variant and seed (a
command run twice) count once, by the newest, and the table's footnote names the others. A run whose summary.json
says it diverged is a row of its own, marked, never averaged with healthy seeds. Within a method, the hyperparameters
that differ between its runs name the variant (e.g. "fedprox mu=0.1"); other keys that differ between
runs name the setting (e.g. "partition.alpha=0.1"; the dataset/partition only where it differs). Accuracies
are shown in percent, each column's best in bold. A sweep directory (with fl.sweep's sweep.json) also gets a
plot of its metric against the swept value with the chosen point marked. A run directory or sweep.json that cannot
be read is skipped with a warning naming it and why. Exit codes: 0 written, 2 bad input.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

from fl.report.aliases import current_name
from fl.report.groups import group_runs, setting_base
from fl.report.html import html_page
from fl.report.plots import all_figures
from fl.report.runs import ReportError, Run, load_local, load_sweeps
from fl.report.tables import (
    DEFAULT_METRIC,
    columns,
    default_metrics,
    latex_table,
    markdown_table,
    model_selection,
    model_selection_table,
    table_rows,
)
from fl.report.wandb_access import load_wandb


# ---- the report ----------------------------------------------------------------------------------------
def write_report(runs: list[Run], out: Path, metrics: Optional[list[str]] = None, plots: bool = True,
                 title: str = "Comparison", notes: Optional[list[str]] = None,
                 extra_metrics: Optional[list[str]] = None, sweeps: tuple = ()) -> dict[str, Path]:
    """report.md, report.tex, plots/*.png and report.html (self-contained) in `out`. `sweeps`: the sweep.json
    manifests of sweep directories among the inputs (load_sweeps), each plotted against its swept value."""
    groups = group_runs(runs)
    metrics = metrics or default_metrics(groups, extra_metrics)
    rows = table_rows(groups, metrics)
    check_out(out)
    out.mkdir(parents=True, exist_ok=True)
    md = markdown_table(rows, metrics)
    figures = []
    if plots:
        figures = all_figures(groups, metrics, out / "plots", sweeps)
    k = ", ".join(sorted({str(x) for r in rows for x in r["last_k"]}))
    caption = (f"Mean ± sample std over seeds. final: the last evaluation; last {k}: the mean over the last {k} "
               "evaluations; @best val: at the round with the best target validation accuracy. Accuracies "
               "(metrics named acc or f1) in %, other metrics as logged. Bold: each column's best among the "
               "methods of a setting (over the whole column when each setting has one row); lower is better for "
               "losses, std, KL and adaptability.")
    bases = {setting_base(r) for r in runs}
    if len(bases) == 1:  # the labels leave out what every setting shares
        caption += f" All runs: {bases.pop()}; setting labels show what differs."
    lines = [f"# {title}", "", caption, "", md]
    for val in dict.fromkeys(["val/target_acc"] + [m for m in extra_metrics or [] if m.startswith("val/")]):
        selected = model_selection_table(model_selection(groups, val))
        if selected:
            lines += ["## Model selection" + ("" if val == "val/target_acc" else f" on {val}"), "", selected]
    lines += [f"![{name}](plots/{p.name})" for name, p in figures]
    if notes:
        lines += ["", *[f"- {n}" for n in notes]]
    paths = {"markdown": out / "report.md", "latex": out / "report.tex", "html": out / "report.html"}
    paths["markdown"].write_text("\n".join(lines) + "\n")
    paths["latex"].write_text(latex_table(rows, metrics))
    paths["html"].write_text(html_page(title, caption, rows, columns(rows, metrics), figures, notes or []))
    return paths


def check_out(out: Path) -> None:
    """ReportError before anything is written when `out` (or a folder above it) is a file."""
    for folder in (out, *out.parents):
        if folder.exists() and not folder.is_dir():
            raise ReportError(f"--out {out}: {folder} is a file, expected a folder for the report")


def load_inputs(paths: list[str], wandb: Optional[str] = None, filters: Optional[dict] = None
                ) -> tuple[list[Run], list[dict], list[str]]:
    """The runs to compare (from run directories or folders of them, or from a W&B project), the sweep.json of each
    sweep directory among `paths`, and notes on what was skipped or read in part; the CLI and
    notebooks/compare.ipynb both read their inputs here."""
    if wandb:
        return load_wandb(wandb, filters), [], []
    runs, notes = load_local(paths)
    sweeps, sweep_notes = load_sweeps(paths)
    return runs, sweeps, notes + sweep_notes


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
        out = Path(args.out) if args.out else (Path(args.paths[0]) / "report" if len(args.paths) == 1
                                               and not (Path(args.paths[0]) / "summary.json").is_file()
                                               else Path("outputs") / "report")
        check_out(out)
        try:
            filters = json.loads(args.filter) if args.filter else None
        except json.JSONDecodeError as err:
            raise ReportError(f"--filter: not JSON ({err})") from None
        runs, sweeps, notes = load_inputs(args.paths, args.wandb, filters)
        for note in notes:
            print(f"warning: {note}", file=sys.stderr)
        metrics = [current_name(m) for m in args.metrics.split(",")] if args.metrics else None  # old names too
        paths = write_report(runs, out, metrics, plots=not args.no_plots, title=args.title, notes=notes,
                             extra_metrics=[s["metric"] for s in sweeps if s.get("metric")], sweeps=sweeps)
    except ReportError as err:
        for note in err.notes:
            print(f"warning: {note}", file=sys.stderr)
        print(f"error: {err}", file=sys.stderr)
        return 2
    # the report's text without its images: the tables, their footnotes and the notes
    print("\n".join(line for line in paths["markdown"].read_text().splitlines() if not line.startswith("![")).strip())
    repeats = sum(len(r.replaces) for r in runs)  # set by write_report's grouping
    print(f"\nwrote {', '.join(str(p) for p in paths.values())} ({len(runs)} runs"
          + (f", {repeats} left out as repeats of a newer run ‡)" if repeats else ")"))
    return 0
