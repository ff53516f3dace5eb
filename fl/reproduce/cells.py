"""Our value of one table cell from its finished runs: per seed one number, in the paper's units, then the mean and
sample std over seeds (fl.report's mean_std).

A seed's number is the table's statistic of its metric: `final` (the last evaluation), `last` (the mean over the last
K evaluations, FedDRM's "mean over the last 50 rounds") or `best_val` (at the round of the best `select` validation
value: early stopping on validation, as FedPALS selects its models). Where a row has several variants in a column
(FedPALS' lambda grid), each seed takes the variant with the best `select` value, as the paper picks lambda. A
per-client metric (`client/<i>/acc`) is read from the last evaluation that logged it; `clients[new]/<name>` and
`clients[original]/<name>` are the mean of `client/<i>/<name>` over the clients held out of training
(data.new_clients) and over the others. Runs are counted as fl.report counts them: a seed run twice counts once (the
newest), and a run that diverged is never averaged: the cell names it.
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

from fl.report.groups import drop_repeats
from fl.report.marks import DIVERGED
from fl.report.runs import Run
from fl.report.summary import direction
from fl.report.tables import mean_std

CLIENT_GROUP = re.compile(r"^clients\[(new|original)\]/(.+)$")


class CellKey(NamedTuple):
    table: str
    column: str
    row: Optional[str]


@dataclass
class Cell:
    mean: Optional[float] = None
    std: Optional[float] = None
    n: int = 0
    seeds: dict = field(default_factory=dict)      # seed -> value, in the paper's units
    chosen: dict = field(default_factory=dict)     # seed -> the run used (its directory name)
    sources: dict = field(default_factory=dict)    # seed -> the run used (its directory)
    notes: list[str] = field(default_factory=list)  # diverged runs, repeats, missing values
    runs: int = 0                                   # finished runs found for the cell (all variants and seeds)

    @property
    def mark(self) -> str:
        return DIVERGED if any(n.startswith(DIVERGED) for n in self.notes) else ""


def _client_group(run: Run, group: str, name: str) -> Optional[float]:
    """The mean of client/<i>/<name> (last logged) over the held-out (new) or the training (original) clients."""
    total, held = int(run.config.get("data.num_clients", 0)), int(run.config.get("data.new_clients.count", 0) or 0)
    ids = range(total - held, total) if group == "new" else range(total - held)
    values = [v for v in (_last_logged(run, f"client/{i}/{name}") for i in ids) if v is not None]
    return statistics.mean(values) if values and len(values) == len(ids) else None


def _last_logged(run: Run, key: str) -> Optional[float]:
    series = run.series(key)
    return series[-1][1] if series else None


def run_value(run: Run, metric: str, stat: str, select: Optional[str]) -> Optional[float]:
    """One run's number for a cell (as logged: accuracies are fractions), or None where the run lacks it."""
    group = CLIENT_GROUP.match(metric)
    if group:
        return _client_group(run, *group.groups())
    if metric.startswith("client/"):
        return _last_logged(run, metric)
    if stat == "final":
        return run.summary.get("final", {}).get(metric)
    if stat == "last":
        return run.last(metric)
    at = run.summary.get("at_best", {}).get(select)
    if at is None and select == "val/target_acc":  # summaries written before at_best kept only the target's
        at = run.summary.get("at_best_val")
    return (at or {}).get(metric)


def _selection_score(run: Run, select: str) -> float:
    best = run.summary.get("best", {}).get(select)
    if best is None:
        return float("-inf")
    return -best if direction(run.summary, select) == "min" else best


def make_cell(runs: list[Run], metric: str, stat: str, select: Optional[str], factor: float) -> Cell:
    """The cell of `runs` (every finished run of the cell's points, all variants and seeds)."""
    cell = Cell(runs=len(runs))
    kept = drop_repeats(runs)
    for r in kept:
        if r.replaces:
            cell.notes.append(f"seed {r.seed} was run {len(r.replaces) + 1} times; counted once, by its newest "
                              f"run {r.name}")
    healthy = []
    for r in kept:
        if r.diverged:
            d = r.diverged
            cell.notes.append(f"{DIVERGED} {r.name} diverged at round {d.get('round', '?')} ({d.get('reason', '?')}); "
                              "left out")
        else:
            healthy.append(r)
    by_seed: dict = {}
    for r in healthy:
        by_seed.setdefault(r.seed, []).append(r)
    for seed in sorted(by_seed, key=str):
        candidates = by_seed[seed]
        run = max(candidates, key=lambda r: _selection_score(r, select)) if len(candidates) > 1 else candidates[0]
        value = run_value(run, metric, stat, select)
        if value is None:
            cell.notes.append(f"{run.name} has no {metric}" + (f" at its best {select} round" if stat == "best_val"
                                                               else ""))
            continue
        cell.seeds[seed] = value * factor
        cell.chosen[seed] = run.name
        cell.sources[seed] = run.source
    cell.mean, cell.std, cell.n = mean_std(list(cell.seeds.values()))
    return cell
