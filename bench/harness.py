"""The round loop of a config without a run (no run directory, loggers or summary): what the bench scripts time."""
from __future__ import annotations

from pathlib import Path

from fl.core.loop import Orchestrator
from fl.core.registry import METHODS
from fl.data import build_data
from fl.run.train import make_fabric


def orchestrator(cfg, run_dir: Path, data=None) -> Orchestrator:
    """`cfg`'s data (or `data`, built once and shared between configs), its method's server as a Fabric callback, a
    launched Fabric and the Orchestrator over them, as fl.run.train builds them; rounds are then driven by hand
    (`run_round`, `evaluate`)."""
    data = build_data(cfg) if data is None else data
    server = METHODS[cfg.method.name].server_cls(cfg)
    fabric = make_fabric(cfg, [server], [])
    fabric.launch()
    return Orchestrator(cfg, fabric, data, server, Path(run_dir))
