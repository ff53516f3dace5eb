"""Where metrics go: metrics.jsonl in the run directory (always) and Weights & Biases (when enabled)."""
from __future__ import annotations

import functools
import inspect
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

from lightning.fabric.loggers import Logger
from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from fl.core import METHODS
from fl.core.metric_directions import directions_of
from fl.core.run_metrics import run_directions
from fl.report.groups import group_runs
from fl.report.plots import all_figures
from fl.report.runs import Run, flatten
from fl.report.summary import summarize_history
from fl.report.tables import DEFAULT_METRIC
from fl.report.wandb_access import local_last_round, wandb_key, wandb_mode


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


def make_wandb_logger(cfg: DictConfig, run_dir: Path, run_name: str, resume_round: Optional[int] = None):
    """The W&B logger, or None when disabled. `resume_round`: the checkpointed round a resumed run continues
    after (see FLWandbLogger: each round reaches W&B once)."""
    mode = wandb_mode(cfg.logger.wandb.mode)
    if mode == "disabled":
        return None
    os.environ.setdefault("WANDB_SILENT", "true")
    w = cfg.logger.wandb
    group = w.group or f"{cfg.data.name}/{cfg.data.partition.name}"
    id_file = run_dir / "wandb_id"
    run_id = id_file.read_text().strip() if id_file.is_file() else None
    logger = wandb_logger_cls()(cfg, run_dir, resume_round=resume_round, name=run_name, save_dir=str(run_dir),
                                project=w.project, entity=w.entity, group=group, job_type=cfg.method.name,
                                tags=list(w.tags), mode=mode, id=run_id, resume="allow",
                                config=OmegaConf.to_container(cfg, resolve=True))
    if rank_zero_only.rank == 0 and run_id is None:
        id_file.write_text(logger.experiment.id)
    return logger


def rewind_supported() -> bool:
    """Whether this wandb's init takes resume_from ("<run id>?_step=N", W&B's rewind; wandb >= 0.17.1)."""
    import wandb

    return "resume_from" in inspect.signature(wandb.init).parameters


EVAL_PREFIXES = ("test/", "val/")


@functools.cache
def wandb_logger_cls():
    """Defined on first use: importing lightning.pytorch costs seconds, and runs without W&B skip it."""
    from lightning.fabric.loggers.logger import rank_zero_experiment
    from lightning.pytorch.loggers import WandbLogger

    class FLWandbLogger(WandbLogger):
        """Lightning's W&B logger plus the dashboard: define_metric summaries so the run table shows final,
        best and last-K values while the run goes (best/<key>, last<K>/<key>; fl.train adds final/<key> and
        best/<key> from summary.json at the end), a per-client table at every evaluation round, and the
        report's plots (metric vs round, lambda_i / beta_i / V_i / ESS traces) as images at the last round.
        metrics.jsonl stays the source of truth; everything here is derived from the same rows.

        W&B's step (_step) is the round: everything of a round is one history row, committed when the
        round's metrics arrive, with `round` in it as the charts' x axis. A resumed run logs each round once
        (see _start_run)."""

        def __init__(self, cfg: DictConfig, run_dir: Path, resume_round: Optional[int] = None, **kwargs):
            super().__init__(**kwargs)
            # wandb.init's arguments, kept here rather than Lightning's: it adds anonymous=None, which
            # wandb >= 0.19 answers with a deprecation warning on every run
            self._init = {**{k: v for k, v in kwargs.items() if k != "save_dir"}, "dir": kwargs.get("save_dir"),
                          "project": self.name}  # Lightning's resolved project (WANDB_PROJECT or its default)
            self._run = None
            self._cfg, self._run_dir = cfg, Path(run_dir)
            self._last_k = int(cfg.trainer.last_k)
            self._evals: Optional[list[dict]] = None  # evaluation rows so far (rebuilt from metrics.jsonl on resume)
            self._directions: Optional[dict] = None  # the run's declared metric directions, read with the first
            self._mode = self._init.get("mode")
            self._resume_round = resume_round
            self._last = -1  # the last round W&B has; set when the run starts

        @property
        @rank_zero_experiment
        def experiment(self):
            if self._run is None:
                self._run = self._start_run()
                define_dashboard_metrics(self._run, self._last_k)
            return self._run

        def _start_run(self):
            """wandb.init, learning which rounds W&B has already, so that each round reaches it once. A resumed
            run replays the rounds after its checkpoint; an earlier process may have logged some of them.
            Online, W&B says where the run stands (its starting step, as _step is the round): rounds past the
            checkpoint are rewound (resume_from) where this wandb can, else skipped. Offline, every process
            writes its own segment (offline-run-*) of the run id; the segments' transaction logs hold what W&B
            will have after `wandb sync`, and rounds in them are skipped. Rounds W&B lacks up to the checkpoint
            (a killed process loses its unwritten tail; W&B disabled before) are logged from metrics.jsonl."""
            import wandb

            run_id, k = self._init.get("id"), self._resume_round
            if self._mode != "online":
                self._last = local_last_round(self._run_dir / "wandb", run_id) if run_id else -1
            try:
                run = wandb.init(**self._init)
            except Exception as err:  # W&B must never cost the run: metrics.jsonl has everything, `wandb sync` later
                reason = (str(err).strip().splitlines() or [type(err).__name__])[-1][:160]
                print(f"warning: W&B could not start run {run_id} ({reason}); this run logs to metrics.jsonl only",
                      file=sys.stderr)
                return wandb.init(mode="disabled")
            if self._mode != "online":
                return run
            self._last = int(getattr(run, "starting_step", 0) or 0) - 1
            if k is None or self._last <= k or not rewind_supported():
                return run
            run.finish()  # W&B has rounds past the checkpoint: truncate its history to the checkpoint
            init = {key: v for key, v in self._init.items() if key != "resume"}  # resume excludes resume_from
            try:
                run = wandb.init(**init, resume_from=f"{run_id}?_step={k}")
            except Exception as err:  # e.g. rewind not enabled on this W&B server: skip the rounds it has
                reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                print(f"warning: W&B did not rewind run {run_id} to round {k} ({reason}); its rounds up to "
                      f"{self._last} stay as logged before", file=sys.stderr)
                return wandb.init(**self._init)
            self._last = k
            return run

        @rank_zero_only
        def log_metrics(self, metrics, step=None) -> None:
            run = self.experiment  # first: starting the run may rewind it, which sets self._last
            metrics = dict(metrics)
            if step is None:  # the partition's images and table, before the first round: they join its row
                run.log({**self._wandb_row(metrics), "round": self._last + 1}, step=self._last + 1, commit=False)
            elif step > self._last:  # a resumed run replays rounds after its checkpoint; W&B may have them
                self._catch_up(run, step)
                self._log_round(run, metrics, step)

        def _catch_up(self, run, step: int) -> None:
            """Rounds before `step` that W&B lacks (a killed process's unwritten tail, W&B disabled earlier),
            from metrics.jsonl, before anything of round `step` is logged (W&B's steps only go up)."""
            if step > self._last + 1:
                for row in _read_jsonl(self._run_dir / "metrics.jsonl"):
                    if self._last < row.get("round", -1) < step:
                        self._log_round(run, {k: v for k, v in row.items() if k != "round"}, row["round"])

        def _log_round(self, run, metrics: dict, step: int) -> None:
            row = self._wandb_row(metrics)
            if any(k.startswith(EVAL_PREFIXES) for k in metrics):
                row.update(self._running_summaries(metrics, step))
                table = client_table(metrics, step)
                if table is not None:
                    row["clients/metrics"] = table
            with tempfile.TemporaryDirectory() as tmp:  # the plots' files must exist until they are logged
                if step == self._cfg.trainer.rounds - 1:
                    row.update(self._round_plots(Path(tmp)))
                # one history record per round, committed: W&B has a round whole or not at all
                run.log({**row, "round": step}, step=step, commit=True)
            self._last = step

        @staticmethod
        def _wandb_row(metrics: dict) -> dict:
            return {wandb_key(k): v for k, v in metrics.items()}

        def _running_summaries(self, metrics: dict, step: int) -> dict:
            if self._evals is None:
                self._evals = [r for r in _read_jsonl(self._run_dir / "metrics.jsonl")
                               if r.get("round", -1) < step and any(k.startswith(EVAL_PREFIXES) for k in r)]
            self._evals.append({"round": step, **metrics})
            if self._directions is None:
                self._directions = run_directions(self._cfg)
            return running_summaries(self._evals, self._last_k, self._directions)

        @rank_zero_only
        def log_histogram(self, key: str, values: list[float], step: int) -> None:
            """A distribution (e.g. pFedFDA's beta_i over clients) as a W&B histogram in the round's row;
            metrics.jsonl keeps the per-client scalars instead."""
            import wandb

            run = self.experiment
            if step > self._last:
                self._catch_up(run, step)
                run.log({key: wandb.Histogram(values), "round": step}, step=step, commit=False)

        @rank_zero_only
        def log_checkpoint(self, path: Path) -> None:
            """The final checkpoint as a W&B model artifact, online and with logger.wandb.log_checkpoint=true
            (offline, an artifact would sit in the offline run until `wandb sync`)."""
            if self._mode != "online" or not self._cfg.logger.wandb.get("log_checkpoint", False):
                return
            import wandb

            run = self.experiment
            artifact = wandb.Artifact(f"checkpoint-{run.id}", type="model",
                                      metadata={"round": self._last, "run_dir": str(self._run_dir)})
            # immutable: the file is not copied to a staging folder; nothing writes it after the last round
            artifact.add_file(str(path), name=Path(path).name, policy="immutable")
            run.log_artifact(artifact, aliases=["final", "latest"])

        def _round_plots(self, folder: Path) -> dict:
            import wandb

            # one run, one setting: the metric part of the caption names the panel
            return {"plots/" + re.sub(r"[^A-Za-z0-9]+", "_", name.split(": ")[-1]).strip("_"):
                    wandb.Image(str(path), caption=name)
                    for name, path in round_plots(self._cfg, self._run_dir, folder)}

    return FLWandbLogger


def define_dashboard_metrics(run, last_k: int) -> None:
    """`round` on the x axis of every chart; the run table's columns: <key> = final value, best/<key>,
    last<K>/<key> (the last two hidden from the charts). W&B's default summary (the last value, a plain number)
    is kept: an aggregate such as summary="max" turns the summary into {"max": v}, which sweeps cannot read."""
    run.define_metric("round")
    run.define_metric("*", step_metric="round")
    for pattern in ("best/*", f"last{last_k}/*"):
        run.define_metric(pattern, step_metric="round", hidden=True)


def running_summaries(evals: list[dict], last_k: int, directions: dict) -> dict[str, float]:
    """best/<key> and last<K>/<key> of every test/ and val/ scalar over the evaluation rows so far (best/<key> of those
    declared better one way: `directions`, fl/core/metric_directions.py); the same rules as summary.json
    (fl.report.summary), so the final W&B values equal the file's."""
    rows = [{k: v for k, v in r.items() if k == "round" or k.startswith(EVAL_PREFIXES)} for r in evals]
    s = summarize_history(rows, last_k, directions_of({k for r in rows for k in r}, directions))
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
