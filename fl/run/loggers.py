"""Where metrics go: metrics.jsonl in the run directory (always) and Weights & Biases (when enabled)."""
from __future__ import annotations

import functools
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Optional

from lightning.fabric.loggers import Logger
from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from fl.core import METHODS
from fl.report.plots import all_figures
from fl.report.runs import Run, flatten
from fl.report.summary import summarize_history
from fl.report.tables import DEFAULT_METRIC, group_runs
from fl.report.wandb_access import wandb_mode


class JsonlLogger(Logger):
    """One JSON object per logged round, so results never depend on a W&B server."""

    def __init__(self, path: Path):
        super().__init__()
        self.path = Path(path)

    @property
    def name(self) -> str:
        return "jsonl"

    @property
    def version(self) -> int:
        return 0

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, Any], step: Optional[int] = None) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"round": step, **metrics}) + "\n")

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    @rank_zero_only
    def rewrite(self, history: list[dict]) -> None:
        """On resume: metrics.jsonl holds exactly the checkpointed history (drops rounds after it)."""
        with self.path.open("w") as f:
            for row in history:
                f.write(json.dumps(row) + "\n")


def make_wandb_logger(cfg: DictConfig, run_dir: Path, run_name: str):
    mode = wandb_mode(cfg.logger.wandb.mode)
    if mode == "disabled":
        return None
    os.environ.setdefault("WANDB_SILENT", "true")
    w = cfg.logger.wandb
    group = w.group or f"{cfg.data.name}/{cfg.data.partition.name}"
    id_file = run_dir / "wandb_id"
    run_id = id_file.read_text().strip() if id_file.is_file() else None
    logger = wandb_logger_cls()(cfg, run_dir, name=run_name, save_dir=str(run_dir), project=w.project,
                                entity=w.entity, group=group, job_type=cfg.method.name, tags=list(w.tags), mode=mode,
                                id=run_id, resume="allow", config=OmegaConf.to_container(cfg, resolve=True))
    if rank_zero_only.rank == 0 and run_id is None:
        id_file.write_text(logger.experiment.id)
    return logger


EVAL_PREFIXES = ("test/", "val/")


@functools.cache
def wandb_logger_cls():
    """Defined on first use: importing lightning.pytorch costs seconds, and runs without W&B skip it."""
    from lightning.pytorch.loggers import WandbLogger

    class FLWandbLogger(WandbLogger):
        """Lightning's W&B logger plus the dashboard: define_metric summaries so the run table shows final,
        best and last-K values while the run goes (best/<key>, last<K>/<key>; fl.train adds final/<key> and
        best/<key> from summary.json at the end), a per-client table at every evaluation round, and the
        report's plots (metric vs round, lambda_i / beta_i / V_i / ESS traces) as images at the last round.
        metrics.jsonl stays the source of truth; everything here is derived from the same rows."""

        def __init__(self, cfg: DictConfig, run_dir: Path, **kwargs):
            super().__init__(**kwargs)
            self._cfg, self._run_dir = cfg, Path(run_dir)
            self._last_k = int(cfg.trainer.last_k)
            self._evals: Optional[list[dict]] = None  # evaluation rows so far (rebuilt from metrics.jsonl on resume)
            self._defined = False

        @property
        def experiment(self):
            run = super().experiment
            if not self._defined and rank_zero_only.rank == 0 and hasattr(run, "define_metric"):
                self._defined = True
                define_dashboard_metrics(run, self._last_k)
            return run

        @rank_zero_only
        def log_metrics(self, metrics, step=None) -> None:
            metrics = dict(metrics)
            evaluated = step is not None and any(k.startswith(EVAL_PREFIXES) for k in metrics)
            if evaluated:
                metrics.update(self._running_summaries(metrics, step))
            super().log_metrics(metrics, step)
            if evaluated:
                table = client_table(metrics, step)
                if table is not None:
                    self.experiment.log({"clients/metrics": table, "trainer/global_step": step})
            if step is not None and step == self._cfg.trainer.rounds - 1:
                self._log_round_plots(step)

        def _running_summaries(self, metrics: dict, step: int) -> dict:
            if self._evals is None:
                self._evals = [r for r in _read_jsonl(self._run_dir / "metrics.jsonl")
                               if r.get("round", -1) < step and any(k.startswith(EVAL_PREFIXES) for k in r)]
            self._evals.append({"round": step, **metrics})
            return running_summaries(self._evals, self._last_k)

        @rank_zero_only
        def log_histogram(self, key: str, values: list[float], step: int) -> None:
            """A distribution (e.g. pFedFDA's beta_i over clients) as a W&B histogram; metrics.jsonl keeps the
            per-client scalars instead."""
            import wandb

            self.experiment.log({key: wandb.Histogram(values), "trainer/global_step": step})

        def _log_round_plots(self, step: int) -> None:
            import wandb

            with tempfile.TemporaryDirectory() as tmp:
                # one run, one setting: the metric part of the caption names the panel
                images = {"plots/" + re.sub(r"[^A-Za-z0-9]+", "_", name.split(": ")[-1]).strip("_"):
                          wandb.Image(str(path), caption=name)
                          for name, path in round_plots(self._cfg, self._run_dir, Path(tmp))}
                if images:
                    self.experiment.log({**images, "trainer/global_step": step})

    return FLWandbLogger


def define_dashboard_metrics(run, last_k: int) -> None:
    """Rounds on the x axis; the run table's columns: <key> = final value, best/<key>, last<K>/<key> (the
    last two hidden from the charts). W&B's default summary (the last value, a plain number) is kept:
    an aggregate such as summary="max" turns the summary into {"max": v}, which sweeps cannot read."""
    run.define_metric("trainer/global_step")
    for pattern in ("test/*", "val/*", "train/*", "server/*", "comm/*", "client/*"):
        run.define_metric(pattern, step_metric="trainer/global_step")
    for pattern in ("best/*", f"last{last_k}/*"):
        run.define_metric(pattern, step_metric="trainer/global_step", hidden=True)


def running_summaries(evals: list[dict], last_k: int) -> dict[str, float]:
    """best/<key> and last<K>/<key> of every test/ and val/ scalar over the evaluation rows so far; the
    same rules as summary.json (fl.report.summary), so the final W&B values equal the file's."""
    rows = [{k: v for k, v in r.items() if k == "round" or k.startswith(EVAL_PREFIXES)} for r in evals]
    s = summarize_history(rows, last_k)
    out = {f"best/{k}": v for k, v in s["best"].items()}
    out.update({f"last{last_k}/{k}": v for k, v in s[f"mean_last_{last_k}"].items()})
    return out


def client_table(metrics: dict, step: int):
    """client/<i>/<name> scalars of one round as a wandb.Table: round, client, then one column per name."""
    pattern = re.compile(r"^client/(\d+)/(.+)$")
    per_client: dict[int, dict[str, float]] = {}
    for key, value in metrics.items():
        m = pattern.match(key)
        if m and isinstance(value, (int, float)):
            per_client.setdefault(int(m.group(1)), {})[m.group(2)] = float(value)
    if not per_client:
        return None
    import wandb

    names = sorted({n for d in per_client.values() for n in d})
    rows = [[step, cid, *[d.get(n) for n in names]] for cid, d in sorted(per_client.items())]
    return wandb.Table(columns=["round", "client", *names], data=rows)


def round_plots(cfg: DictConfig, run_dir: Path, folder: Path) -> list[tuple[str, Path]]:
    """The report's figures for this one run, from its metrics.jsonl."""
    run = Run(run_dir.name, str(run_dir), flatten(OmegaConf.to_container(cfg, resolve=True)), {},
              _read_jsonl(run_dir / "metrics.jsonl"))
    metrics = list(dict.fromkeys([METHODS[cfg.method.name].headline or DEFAULT_METRIC, DEFAULT_METRIC]))
    return all_figures(group_runs([run]), metrics, folder)


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
