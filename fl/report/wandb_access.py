"""Weights & Biases access: which mode a run uses (online with an API key, offline without; never a prompt),
and finished runs read back through W&B's API for the report."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from fl.report.runs import ReportError, Run, flatten
from fl.report.summary import summarize_history


def has_wandb_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "api.wandb.ai" in netrc.read_text()
    except OSError:
        return False


def wandb_mode(requested: str) -> str:
    """auto -> WANDB_MODE if set, else online with an API key and offline without; never prompts."""
    if requested != "auto":
        return requested
    return os.environ.get("WANDB_MODE") or ("online" if has_wandb_key() else "offline")


def load_wandb(project: str, filters: Optional[dict] = None, api: Any = None) -> list[Run]:
    """Finished runs of a W&B project (entity/project) through wandb.Api; per round, the history rows
    logged at the same trainer/global_step are merged into one metrics.jsonl-like row."""
    if project.count("/") != 1:
        raise ReportError(f"--wandb {project!r}: expected ENTITY/PROJECT")
    if api is None:
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
            summary = {**summarize_history(history, int(config.get("trainer.last_k", 5))),
                       "headline": dict(r.summary).get("headline")}
            runs.append(Run(r.name, getattr(r, "url", r.name), config, summary, history))
    except ReportError:
        raise
    except Exception as err:  # network and permission errors end in one line, not a traceback
        raise ReportError(f"--wandb {project}: {type(err).__name__}: {str(err).splitlines()[0]}") from None
    if not runs:
        raise ReportError(f"--wandb {project}: no finished runs{' matching the filter' if filters else ''}")
    return runs
