"""Finished runs as the report reads them: a run directory (config.yaml, summary.json, metrics.jsonl) or a W&B
run (fl/report/wandb_access.py), flattened into one Run each."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf


class ReportError(ValueError):
    """Bad input to the report; the message is one line."""


@dataclass
class Run:
    name: str
    source: str
    config: dict            # flattened: "method.name" -> "fedprox"
    summary: dict           # as in summary.json: final / best / best_round / mean_last_K / last_k
    history: list = field(default_factory=list)  # metrics.jsonl rows
    method: str = ""        # label: method name plus the hyperparameters that vary within it
    setting: str = ""

    @property
    def seed(self) -> Any:
        return self.config.get("seed")

    @property
    def headline(self) -> Optional[str]:
        """The metric the run's method leads with (its paper's), as fl.train recorded it; None for baselines."""
        return self.summary.get("headline")

    def last(self, metric: str) -> Optional[float]:
        return self.summary.get(f"mean_last_{self.summary.get('last_k')}", {}).get(metric)

    def series(self, key: str) -> list[tuple[int, float]]:
        return [(r["round"], float(r[key])) for r in self.history
                if isinstance(r.get(key), (int, float)) and not math.isnan(r[key])]


def flatten(d: Any, prefix: str = "") -> dict:
    if isinstance(d, dict):
        out = {}
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): d}


# ---- loading ---------------------------------------------------------------------------------------
def load_run_dir(path: Path) -> Run:
    config = flatten(OmegaConf.to_container(OmegaConf.load(path / "config.yaml")))
    summary = json.loads((path / "summary.json").read_text())
    metrics = path / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.is_file() else []
    history = [json.loads(line) for line in lines if line.strip()]
    return Run(path.name, str(path), config, summary, history)


def load_local(paths: list[str | Path]) -> tuple[list[Run], list[str]]:
    """Run directories, or folders holding them (a sweep directory, outputs/); returns runs and notes
    about directories that have no summary.json (unfinished runs)."""
    runs, notes, seen = [], [], set()
    for p in map(Path, paths):
        if not p.is_dir():
            raise ReportError(f"{p}: not a directory (expected a run directory or a folder of runs)")
        found = [p] if (p / "summary.json").is_file() else sorted(s.parent for s in p.rglob("summary.json"))
        pending = [c.parent for c in p.rglob("config.yaml") if not (c.parent / "summary.json").is_file()]
        notes += [f"skipped {d}: no summary.json (unfinished run)" for d in sorted(pending)]
        for d in found:
            if d.resolve() not in seen and (d / "config.yaml").is_file():
                seen.add(d.resolve())
                runs.append(load_run_dir(d))
    if not runs:
        raise ReportError(f"no finished runs (run directories with summary.json) under {', '.join(map(str, paths))}")
    return runs, notes
