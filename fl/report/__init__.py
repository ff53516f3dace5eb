"""Results: the summary of a run (final / best / last-K, used by fl.train), and the comparison of finished runs
(`python -m fl.report`): tables, plots and an HTML page, from run directories or W&B.

The names below load with their module on first use, so a run (which needs only the summary) and the command
line's help never import matplotlib."""
import importlib

_MODULE_OF = {
    "load_inputs": "cli", "write_report": "cli", "all_figures": "plots", "group_runs": "groups", "ReportError": "runs",
    "Run": "runs", "load_local": "runs", "load_sweeps": "runs", "summarize_history": "summary",
    "default_metrics": "tables", "latex_table": "tables", "markdown_table": "tables", "table_rows": "tables",
    "load_wandb": "wandb_access",
}
__all__ = list(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'fl.report' has no attribute {name!r}")
    return getattr(importlib.import_module(f"fl.report.{_MODULE_OF[name]}"), name)
