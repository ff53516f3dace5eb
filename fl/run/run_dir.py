"""The run directory: created once by the parent process (launched ranks find it through FL_RUN_DIR), or, when
torchrun or srun started the processes, named by logger.run_name on every node; with config.yaml, the partition's
description and heatmaps, and summary.json at the end."""
from __future__ import annotations

import itertools
import json
import os
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

from omegaconf import DictConfig

from fl.config import ConfigError, to_yaml
from fl.data.plots import partition_heatmaps, write_partition_info
from fl.report.wandb_access import wandb_mode

RUN_DIR_ENV = "FL_RUN_DIR"  # lets the processes a Fabric launcher starts find the parent's run directory


def new_run_dir(cfg: DictConfig) -> Path:
    """Create and return outputs/<run_name> (or <run_name>-1, -2, ... when taken, also by a run starting at the
    same moment: mkdir is the claim)."""
    name = cfg.logger.run_name or f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.method.name}-{cfg.data.name}-s{cfg.seed}"
    base = Path(cfg.logger.output_dir) / name
    base.parent.mkdir(parents=True, exist_ok=True)
    for n in itertools.count():
        run_dir = Path(f"{base}-{n}") if n else base
        try:
            run_dir.mkdir()
            return run_dir
        except FileExistsError:
            continue


def external_launch() -> tuple[str, int, int] | None:
    """(launcher, processes, this one's global rank) when torchrun or srun started more than one process for this
    run, each on its own: nothing is shared between them before the process group forms."""
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment  # a run's import

    for name, env in (("torchrun", TorchElasticEnvironment), ("srun", SLURMEnvironment)):
        if env.detect():
            launched = env()
            if launched.world_size() > 1:
                return name, launched.world_size(), launched.global_rank()
    return None


def launched_run_dir(cfg: DictConfig) -> Path | None:
    """The run directory every process torchrun or srun started uses: outputs/<logger.run_name> on each node
    (the processes cannot agree on a generated name); None when this process was not started that way. Raises
    ConfigError, before anything is written, without a name or when rank 0 finds a run already there."""
    launch = os.environ.get(RUN_DIR_ENV) is None and not cfg.resume and external_launch()
    if not launch:
        return None
    launcher, processes, rank = launch
    if not cfg.logger.run_name:
        raise ConfigError(f"{launcher} started {processes} processes: set logger.run_name=NAME, the run directory "
                          "all of them use on every node (outputs/NAME)")
    run_dir = Path(cfg.logger.output_dir) / cfg.logger.run_name
    if rank == 0 and ((run_dir / "metrics.jsonl").exists() or (run_dir / "checkpoints").exists()):
        raise ConfigError(f"logger.run_name={cfg.logger.run_name!r}: {run_dir} already holds a run; continue it "
                          f"with resume={run_dir}, or choose another logger.run_name")
    return run_dir


def planned_run_dir(cfg: DictConfig, named: Path | None = None) -> Path | None:
    """The run directory this process will use, where it is known before it is created (resume=, a launched rank's,
    torchrun's or srun's `named` one, or logger.run_name's while no run holds it); None when its name is drawn at
    creation."""
    if os.environ.get(RUN_DIR_ENV):
        return Path(os.environ[RUN_DIR_ENV])
    if cfg.resume or named is not None:
        return Path(cfg.resume or named)
    if cfg.logger.run_name and not (Path(cfg.logger.output_dir) / cfg.logger.run_name).exists():
        return Path(cfg.logger.output_dir) / cfg.logger.run_name
    return None


def prepare_run_dir(cfg: DictConfig, named: Path | None = None) -> Path:
    """The parent process creates the run directory and writes config.yaml; launched ranks reuse it. `named`:
    the directory of `launched_run_dir`, which every process started by torchrun or srun creates on its node."""
    if os.environ.get(RUN_DIR_ENV):
        return Path(os.environ[RUN_DIR_ENV])
    if cfg.resume or named is not None:
        run_dir = Path(cfg.resume or named)
        run_dir.mkdir(parents=True, exist_ok=True)
    else:
        run_dir = new_run_dir(cfg)
    # every node needs config.yaml for a resume; processes sharing a filesystem write it side by side
    tmp = run_dir / f"config.yaml.{os.getpid()}.tmp"
    tmp.write_text(to_yaml(cfg))
    tmp.replace(run_dir / "config.yaml")
    launch = external_launch()
    logs_to_wandb = wandb_mode(cfg.logger.wandb.mode) != "disabled" and (launch is None or launch[2] == 0)  # rank 0
    if logs_to_wandb and not (run_dir / "wandb_id").exists():
        (run_dir / "wandb_id").write_text(uuid.uuid4().hex[:12])
    os.environ[RUN_DIR_ENV] = str(run_dir)
    return run_dir


def log_partition(data, run_dir: Path, wandb_logger, plots: bool = True) -> None:
    """partition.json and (`plots`) heatmaps (PNG) in the run directory; on W&B the same images, a table of client
    sizes and the partition fingerprint (also recorded in config.yaml and summary.json)."""
    write_partition_info(data, run_dir / "partition.json")
    paths = partition_heatmaps(data, run_dir) if plots else []
    if wandb_logger is None:
        return
    wandb_logger.experiment.config.update({"partition_fingerprint": data.fingerprint()}, allow_val_change=True)
    if paths:
        wandb_logger.log_image(key="data/partition", images=[str(p) for p in paths])
    counts = data.label_counts("train")
    rows = [[i, len(c.train), len(c.test), int((counts[i] > 0).sum()),
             data.domain_names[c.domain] if data.domain_names else ""] for i, c in enumerate(data.clients)]
    wandb_logger.log_table(key="data/clients", columns=["client", "train", "test", "classes", "domain"], data=rows)


def write_summary(run_dir: Path, summary: dict) -> None:
    """summary.json, atomically (a temporary file, then a rename), with the time it was written as `finished_at`
    (UTC, ISO 8601): of identical runs fl.report keeps the newest, and a copy may not keep the file's own time."""
    tmp = run_dir / "summary.json.tmp"
    finished = datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    tmp.write_text(json.dumps({**summary, "finished_at": finished}, indent=2))
    tmp.replace(run_dir / "summary.json")
