"""Results: the summary of a run (final / best / last-K, used by fl.train), and the comparison of finished runs
(`python -m fl.report`): tables, plots and an HTML page, from run directories or W&B."""
from fl.report.cli import load_inputs, write_report
from fl.report.groups import group_runs
from fl.report.plots import all_figures
from fl.report.runs import ReportError, Run, load_local, load_sweeps
from fl.report.summary import summarize_history
from fl.report.tables import default_metrics, latex_table, markdown_table, table_rows
from fl.report.wandb_access import load_wandb

__all__ = ["load_inputs", "write_report", "all_figures", "ReportError", "Run", "load_local", "load_sweeps",
           "summarize_history", "default_metrics", "group_runs", "latex_table", "markdown_table", "table_rows",
           "load_wandb"]
