"""Results: the summary of a run (final / best / last-K, used by fl.train), and the comparison of finished runs
(`python -m fl.report`): tables, plots and an HTML page, from run directories or W&B."""
from fl.report.cli import write_report
from fl.report.plots import all_figures
from fl.report.runs import ReportError, Run, load_local
from fl.report.summary import summarize_history
from fl.report.tables import (
    default_metrics,
    group_runs,
    latex_table,
    load_sweeps,
    markdown_table,
    sweep_metrics,
    table_rows,
)
from fl.report.wandb_access import load_wandb

__all__ = ["write_report", "all_figures", "ReportError", "Run", "load_local", "summarize_history", "default_metrics",
           "group_runs", "latex_table", "load_sweeps", "markdown_table", "sweep_metrics", "table_rows", "load_wandb"]
