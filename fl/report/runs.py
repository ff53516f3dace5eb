"""Finished runs as the report reads them: a run directory (config.yaml, summary.json, metrics.jsonl) or a W&B
run (fl/report/wandb_access.py), flattened into one Run each. A run directory the report cannot read is skipped
with a note naming it and the reason, so one bad directory does not lose the report on the others."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

from fl.report.aliases import current_name, current_names, current_summary


class ReportError(ValueError):
    """Bad input to the report; the message is one line. `notes`: what was skipped on the way (one line each)."""

    def __init__(self, message: str, notes: tuple = ()):
        super().__init__(message)
        self.notes = list(notes)


class BadRun(ValueError):
    """A run directory the report cannot read; the message says which file and why, in one line."""


@dataclass
class Run:
    name: str
    source: str
    config: dict            # flattened: "method.name" -> "fedprox"
    summary: dict           # as in summary.json: final / best / best_round / mean_last_K / last_k
    history: list = field(default_factory=list)  # metrics.jsonl rows
    method: str = ""        # label: method name plus the hyperparameters that vary within it
    setting: str = ""
    # when the run finished (unix seconds) and where that was read: the newest of identical runs is the one kept
    finished: Optional[float] = None
    finished_from: str = ""
    replaces: list = field(default_factory=list)  # older runs of the same setting, variant and seed it stands for

    @property
    def seed(self) -> Any:
        return self.config.get("seed")

    @property
    def headline(self) -> Optional[str]:
        """The metric the run's method leads with (its paper's), as fl.train recorded it; None for baselines."""
        return self.summary.get("headline")

    @property
    def diverged(self) -> Optional[dict]:
        """summary.json's "diverged" ({round, client, method, reason}, written by a run that diverged); None for a
        healthy run. A value of another shape still marks the run: a wrongly written marker must not hide it."""
        value = self.summary.get("diverged")
        if value is None or value is False:
            return None
        return value if isinstance(value, dict) else {"reason": str(value)}

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


# ---- reading one run directory -------------------------------------------------------------------------
def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def _kind(value: Any) -> str:
    return {list: "a list", str: "a string", type(None): "nothing"}.get(type(value), type(value).__name__)


def read_config(path: Path) -> dict:
    try:
        config = OmegaConf.to_container(OmegaConf.load(path))
    except Exception as err:  # yaml's parser and scanner errors, OmegaConf's, an unreadable file
        raise BadRun(f"{path.name} is not readable YAML ({_first_line(err)})") from None
    if not isinstance(config, dict) or not config:
        raise BadRun(f"{path.name} holds {_kind(config) if config != {} else 'no keys'}, expected the run's config")
    return flatten(config)


def _numbers(summary: dict, key: str) -> None:
    values = summary.get(key, {})
    if not isinstance(values, dict):
        raise BadRun(f"summary.json's {key!r} is {_kind(values)}, expected metric -> value")
    bad = next((k for k, v in values.items() if v is not None and (not isinstance(v, (int, float))
                                                                  or isinstance(v, bool))), None)
    if bad is not None:
        raise BadRun(f"summary.json's {key}[{bad!r}] is {_kind(values[bad])}, expected a number")


def read_summary(path: Path) -> dict:
    """summary.json, checked for the fields the report reads (fl.train's summary: final, best, mean_last_K, ...)."""
    try:
        summary = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BadRun(f"{path.name} is not readable JSON ({_first_line(err)})") from None
    if not isinstance(summary, dict):
        raise BadRun(f"{path.name} holds {_kind(summary)}, expected an object with 'final', 'best', ...")
    if "final" not in summary:
        raise BadRun(f"{path.name} has no 'final' metrics")
    last_k = summary.get("last_k")
    if last_k is not None and (not isinstance(last_k, int) or isinstance(last_k, bool)):
        raise BadRun(f"{path.name}'s 'last_k' is {_kind(last_k)}, expected an integer")
    for key in ("final", "best", f"mean_last_{last_k}"):
        _numbers(summary, key)
    for key in ("best_round", "at_best", "at_best_val"):
        if not isinstance(summary.get(key, {}), dict):
            raise BadRun(f"{path.name}'s {key!r} is {_kind(summary[key])}, expected an object")
    return current_summary(summary)  # an older run's metric names read as today's (fl/report/aliases.py)


def read_history(path: Path, notes: list[str]) -> list[dict]:
    """metrics.jsonl's rows. A last line cut off (a writer killed mid-line) is dropped with a note and the complete
    rows are kept; a bad line before the last one means the file is damaged, and the run is skipped."""
    if not path.is_file():
        return []
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise BadRun(f"{path.name} is not readable ({_first_line(err)})") from None
    numbered = [(i, line) for i, line in enumerate(lines, start=1) if line.strip()]
    rows = []
    for i, line in numbered:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == numbered[-1][0]:
                notes.append(f"{path}: line {i} is cut off (a writer killed mid-line?); read the {len(rows)} "
                             "complete rows before it")
                break
            raise BadRun(f"{path.name} line {i} is not JSON (of {len(numbered)} lines)") from None
        if not isinstance(row, dict) or not isinstance(row.get("round"), int) or isinstance(row["round"], bool):
            raise BadRun(f"{path.name} line {i} is not a row with an integer 'round'")
        rows.append(current_names(row))
    return rows


def finish_time(summary: dict, path: Path) -> tuple[Optional[float], str]:
    """When the run finished: summary.json's finished_at (fl.train records it), else the file's modification time
    (which a copy without its times, `cp -r` or `scp`, resets)."""
    stamp = summary.get("finished_at")
    if isinstance(stamp, str):
        try:
            return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp(), "summary.json's finished_at"
        except ValueError:
            pass
    try:
        return path.stat().st_mtime, "summary.json's modification time"
    except OSError:
        return None, ""


def load_run_dir(path: Path, notes: Optional[list[str]] = None) -> Run:
    """One run directory; BadRun names the file and the reason when it cannot be read. Notes on what was read only
    in part (a cut-off last metrics line) go to `notes`."""
    if not (path / "config.yaml").is_file():
        raise BadRun("summary.json but no config.yaml")
    config = read_config(path / "config.yaml")
    summary = read_summary(path / "summary.json")
    if "method.name" not in config and not isinstance(summary.get("method"), str):
        raise BadRun("no method.name in config.yaml nor a method in summary.json")
    history = read_history(path / "metrics.jsonl", notes if notes is not None else [])
    finished, source = finish_time(summary, path / "summary.json")
    return Run(path.name, str(path), config, summary, history, finished=finished, finished_from=source)


def load_local(paths: list[str | Path]) -> tuple[list[Run], list[str]]:
    """Run directories, or folders holding them (a sweep directory, outputs/); returns runs and notes about
    directories left out (unfinished runs: no summary.json; unreadable ones, with the reason) or read in part."""
    runs, notes, seen = [], [], set()
    for p in map(Path, paths):
        if not p.is_dir():
            raise ReportError(f"{p}: not a directory (expected a run directory or a folder of runs)")
        found = [p] if (p / "summary.json").exists() else sorted(s.parent for s in p.rglob("summary.json"))
        pending = [c.parent for c in p.rglob("config.yaml") if not (c.parent / "summary.json").exists()]
        notes += [f"skipped {d}: no summary.json (unfinished run)" for d in sorted(pending)]
        for d in found:
            if d.resolve() in seen:
                continue
            seen.add(d.resolve())
            try:
                runs.append(load_run_dir(d, notes))
            except BadRun as err:
                notes.append(f"skipped {d}: {err}")
    if not runs:
        raise ReportError(f"no finished runs (run directories with a readable summary.json) under "
                          f"{', '.join(map(str, paths))}", notes)
    return runs, notes


# ---- sweep manifests -----------------------------------------------------------------------------------
def _number_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def check_sweep(manifest: Any) -> None:
    """BadRun naming the field when a sweep.json is not fl.sweep's: {name, metric, goal, points: [{params, mean,
    std, values}], best}."""
    if not isinstance(manifest, dict):
        raise BadRun(f"holds {_kind(manifest)}, expected an object with 'points'")
    points = manifest.get("points", [])
    if not isinstance(points, list):
        raise BadRun(f"'points' is {_kind(points)}, expected a list")
    for i, p in enumerate(points):
        if not isinstance(p, dict) or not isinstance(p.get("params"), dict):
            raise BadRun(f"points[{i}] has no 'params' object")
        for key in ("mean", "std"):
            if not _number_or_none(p.get(key)):
                raise BadRun(f"points[{i}].{key} is {_kind(p[key])}, expected a number or null")
    swept = set(points[0]["params"]) if points else set()
    bad = next((i for i, p in enumerate(points) if set(p["params"]) != swept), None)
    if bad is not None:
        raise BadRun(f"points[{bad}] sweeps {sorted(points[bad]['params'])}, points[0] {sorted(swept)}")
    best = manifest.get("best")
    if best is not None and (not isinstance(best, dict) or not isinstance(best.get("params"), dict)
                             or (points and set(best["params"]) != swept)):
        raise BadRun(f"'best' has no 'params' object with the swept keys {sorted(swept)}")
    if not isinstance(manifest.get("metric", ""), (str, type(None))):
        raise BadRun(f"'metric' is {_kind(manifest['metric'])}, expected a metric name")


def load_sweeps(paths: list) -> tuple[list[dict], list[str]]:
    """The sweep.json of each sweep directory among `paths` (fl.sweep's points with their per-seed values, metric,
    goal and best point), and a note for each one that cannot be read (its runs are still reported)."""
    manifests, notes = [], []
    for path in (Path(p) / "sweep.json" for p in paths):
        if not path.exists():
            continue
        try:
            try:
                manifest = json.loads(path.read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
                raise BadRun(f"not readable JSON ({_first_line(err)})") from None
            check_sweep(manifest)
            if manifest.get("metric"):  # a sweep of an older run names its metric as that run did
                manifest["metric"] = current_name(manifest["metric"])
            manifests.append(manifest)
        except BadRun as err:
            notes.append(f"skipped {path}: {err}; no plot against the swept value")
    return manifests, notes
