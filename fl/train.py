"""Entry point: `python -m fl.train [conf=NAME] [key=value ...]`.

Exit codes: 0 done, 1 a training fault (non-finite loss), 2 bad configuration or data (nothing written),
130 interrupted (a checkpoint of the last completed round was written; continue with resume=<run dir>).
"""
from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path

from omegaconf import DictConfig

RUN_DIR_ENV = "FL_RUN_DIR"  # lets the processes a Fabric launcher starts find the parent's run directory


def _fail(message: str, code: int) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def _twin_hint(argv: list[str]) -> str:
    """Paper configs come with a synthetic twin (the same protocol on embedded data): name it when the
    real data is missing."""
    from fl.config import CONF_DIR

    conf = next((a.split("=", 1)[1] for a in argv if a.startswith("conf=")), None)
    if conf and "/" not in conf and (CONF_DIR / f"{conf}_synthetic.yaml").is_file():
        return f"; to try the same protocol on embedded data: python -m fl.train conf={conf}_synthetic"
    return ""


def make_fabric(cfg: DictConfig, callbacks: list, loggers: list):
    from lightning.fabric import Fabric

    f = cfg.fabric
    precision = {"32": "32-true", "64": "64-true"}.get(str(f.precision), f.precision)
    return Fabric(accelerator=f.accelerator, devices=f.devices, strategy=f.strategy, precision=precision,
                  num_nodes=f.num_nodes, callbacks=callbacks, loggers=loggers)


def _new_run_dir(cfg: DictConfig) -> Path:
    name = cfg.logger.run_name or f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.method.name}-{cfg.data.name}-s{cfg.seed}"
    base = Path(cfg.logger.output_dir) / name
    run_dir, n = base, 1
    while run_dir.exists():
        run_dir, n = Path(f"{base}-{n}"), n + 1
    return run_dir


def prepare_run_dir(cfg: DictConfig) -> Path:
    """The parent process creates the run directory and writes config.yaml; launched ranks reuse it."""
    from fl.config import to_yaml

    if os.environ.get(RUN_DIR_ENV):
        return Path(os.environ[RUN_DIR_ENV])
    run_dir = Path(cfg.resume) if cfg.resume else _new_run_dir(cfg)
    run_dir.mkdir(parents=True, exist_ok=bool(cfg.resume))
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    if not (run_dir / "wandb_id").exists():
        (run_dir / "wandb_id").write_text(uuid.uuid4().hex[:12])
    os.environ[RUN_DIR_ENV] = str(run_dir)
    return run_dir


def log_partition(data, run_dir: Path, wandb_logger) -> None:
    """partition.json and heatmaps (PNG) in the run directory; on W&B the same images, a table of client
    sizes and the partition fingerprint (also recorded in config.yaml and summary.json)."""
    from fl.data.plots import partition_heatmaps, write_partition_info

    write_partition_info(data, run_dir / "partition.json")
    paths = partition_heatmaps(data, run_dir)
    if wandb_logger is None:
        return
    wandb_logger.experiment.config.update({"partition_fingerprint": data.fingerprint()}, allow_val_change=True)
    wandb_logger.log_image(key="data/partition", images=[str(p) for p in paths])
    counts = data.label_counts("train")
    rows = [[i, len(c.train), len(c.test), int((counts[i] > 0).sum()),
             data.domain_names[c.domain] if data.domain_names else ""] for i, c in enumerate(data.clients)]
    wandb_logger.log_table(key="data/clients", columns=["client", "train", "test", "classes", "domain"], data=rows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    owns_env = RUN_DIR_ENV not in os.environ
    try:
        return _run(argv)
    finally:
        if owns_env:
            os.environ.pop(RUN_DIR_ENV, None)


def _run(argv: list[str]) -> int:
    from fl.config import ConfigError, load_config

    try:
        cfg = load_config(argv)
        from fl.data import build_data
        from fl.registry import METHODS

        data = build_data(cfg)
        server = METHODS[cfg.method.name].server_cls(cfg)
        try:  # Fabric validates accelerator / devices / strategy before anything is written
            make_fabric(cfg, [], [])
        except (ValueError, RuntimeError, TypeError) as err:
            f = cfg.fabric
            raise ConfigError(f"fabric.accelerator={f.accelerator!r} fabric.devices={f.devices!r} "
                              f"fabric.strategy={f.strategy!r} rejected: {str(err).splitlines()[0]}") from None
    except ConfigError as err:
        from fl.data import DataError

        return _fail(str(err) + (_twin_hint(argv) if isinstance(err, DataError) else ""), 2)
    except (ValueError, RuntimeError, FileNotFoundError) as err:
        return _fail(f"{type(err).__name__}: {str(err).splitlines()[0]}", 2)

    from fl.loggers import JsonlLogger, make_wandb_logger
    from fl.orchestrator import Interrupted, Orchestrator, TrainingFault
    from fl.progress import format_summary

    run_dir = prepare_run_dir(cfg)
    jsonl = JsonlLogger(run_dir / "metrics.jsonl")
    wandb_logger = make_wandb_logger(cfg, run_dir, run_dir.name)
    fabric = make_fabric(cfg, [server], [jsonl] + ([wandb_logger] if wandb_logger else []))
    fabric.launch()
    if cfg.fabric.cpu_threads:
        import torch

        torch.set_num_threads(cfg.fabric.cpu_threads)
    orch = Orchestrator(cfg, fabric, data, server, run_dir, jsonl)
    if fabric.is_global_zero:
        config = run_dir / "config.yaml"
        config.write_text(f"# partition fingerprint: {data.fingerprint()}\n" + config.read_text())
    if cfg.resume:
        orch.restore()
    elif fabric.is_global_zero:
        jsonl.path.write_text("")
        log_partition(data, run_dir, wandb_logger)
    try:
        summary = orch.fit()
    except TrainingFault as err:
        return _fail(f"{err}; the last good checkpoint is {orch.ckpt_path}", 1)
    except (Interrupted, KeyboardInterrupt) as err:
        if fabric.is_global_zero:
            where = f"checkpoint {orch.ckpt_path}" if orch.ckpt_path.is_file() else "no checkpoint yet"
            print(f"\n{err or 'interrupted'}; {where}. Continue with: python -m fl.train resume={run_dir}",
                  file=sys.stderr)
        return 130
    if fabric.is_global_zero:
        summary.update({"method": cfg.method.name, "dataset": cfg.data.name, "seed": int(cfg.seed),
                        "rounds": int(cfg.trainer.rounds), "partition_fingerprint": data.fingerprint(),
                        "run_dir": str(run_dir)})
        tmp = run_dir / "summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2))
        tmp.replace(run_dir / "summary.json")
        if wandb_logger is not None:
            wandb_logger.experiment.summary.update({f"{kind}/{k}": v for kind in ("final", "best")
                                                    for k, v in summary[kind].items()})
            wandb_logger.experiment.finish()
        print(format_summary(summary))
        files = ", ".join(sorted(p.name for p in run_dir.iterdir()))
        print(f"\nRun directory: {run_dir}  ({files})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
