"""Where metrics go: metrics.jsonl in the run directory (always) and Weights & Biases (when enabled)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

from lightning.fabric.loggers import Logger
from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf


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


def _has_wandb_key() -> bool:
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
    return os.environ.get("WANDB_MODE") or ("online" if _has_wandb_key() else "offline")


def make_wandb_logger(cfg: DictConfig, run_dir: Path, run_name: str):
    mode = wandb_mode(cfg.logger.wandb.mode)
    if mode == "disabled":
        return None
    os.environ.setdefault("WANDB_SILENT", "true")
    from lightning.pytorch.loggers import WandbLogger

    w = cfg.logger.wandb
    group = w.group or f"{cfg.data.name}/{cfg.data.partition}"
    id_file = run_dir / "wandb_id"
    run_id = id_file.read_text().strip() if id_file.is_file() else None
    logger = WandbLogger(name=run_name, save_dir=str(run_dir), project=w.project, entity=w.entity, group=group,
                         job_type=cfg.method.name, tags=list(w.tags), mode=mode, id=run_id, resume="allow",
                         config=OmegaConf.to_container(cfg, resolve=True))
    if rank_zero_only.rank == 0 and run_id is None:
        id_file.write_text(logger.experiment.id)
    return logger


def log_histogram(loggers, key: str, values, step: int) -> None:
    """A distribution (e.g. pFedFDA's beta_i over clients) as a W&B histogram; metrics.jsonl keeps the
    per-client scalars instead. Only the W&B logger on rank zero writes."""
    from lightning.pytorch.loggers import WandbLogger

    for logger in loggers:
        if isinstance(logger, WandbLogger) and rank_zero_only.rank == 0:
            import wandb

            logger.experiment.log({key: wandb.Histogram([float(v) for v in values]), "trainer/global_step": step})
