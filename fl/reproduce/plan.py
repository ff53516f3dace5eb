"""The runs a reproduction needs, as fl.sweep jobs: each column's sweeps at the chosen scale, only the points its rows
use, each with every seed. Run directories and their reuse are the sweep runner's: <out>/runs/<sweep name>/<point
id>-s<seed>, the point id from the point's place in the sweep's own expansion, so a finished run is found again and a
directory made with another config stops the command (fl/sweep/runner.py, check_reuse). A column with overrides (a
harder twin setting) runs in a folder of its own, <sweep name>+<override slug>.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from fl.config import ARM, ConfigError
from fl.reproduce.cells import CellKey
from fl.reproduce.claim_cells import judged_cells
from fl.reproduce.paper import Paper, ReproduceError, SweepRef, Table
from fl.sweep.runner import Job, check_reuse, plan_points, point_id
from fl.sweep.spec import Sweep, expand, load_sweep

# twins run --parallel N at once, one intra-op thread each; without the partition heatmaps, which no output shows and
# which cost a twin run more than the rest of its set-up (partition.json is still written)
TWIN_EXTRA = ("fabric.cpu_threads=1", "logger.partition_plots=false")
DOUBLED = 2  # the budget check: the cells a claim judges, their first seed again at twice the rounds (claims.py)


@dataclass
class Group:
    """One sweep at one set of overrides: the jobs of it that this reproduction runs."""
    ref: SweepRef
    sweep: Sweep
    out: Path
    extra: list[str]
    jobs: dict[str, Job] = field(default_factory=dict)   # run dir name -> job
    longer_than: Optional[str] = None  # the budget check's group: the key of the group whose rounds it doubles

    @property
    def key(self) -> str:
        return self.out.name


@dataclass
class Plan:
    scale: str
    seeds: list[int]
    groups: dict[str, Group] = field(default_factory=dict)           # out dir name -> group
    cells: dict[CellKey, list[Job]] = field(default_factory=dict)    # cell -> its jobs (all variants and seeds)
    not_run: dict[CellKey, str] = field(default_factory=dict)        # cell -> why it is not run at this scale
    doubled: dict[CellKey, list[Job]] = field(default_factory=dict)  # twin: a judged cell -> its first seed's jobs
                                                                     # at DOUBLED times the rounds

    @property
    def jobs(self) -> list[Job]:
        return [j for g in self.groups.values() for j in g.jobs.values()]


def matches(point: dict, where: dict) -> bool:
    """A point matches a filter when, for every key, the point has the key with one of the listed values."""
    for key, want in where.items():
        values = want if isinstance(want, list) else [want]
        if key not in point or point[key] not in values:
            return False
    return True


def _slug(overrides: tuple) -> str:
    if not overrides:
        return ""
    text = "_".join(o.split(".")[-1] for o in overrides)
    digest = hashlib.sha1(" ".join(overrides).encode()).hexdigest()[:6]
    return "+" + re.sub(r"[^A-Za-z0-9._=-]", "", text)[:40] + "-" + digest


def _sweep(ref: SweepRef, cache: dict) -> tuple[Sweep, list[dict]]:
    if ref.sweep not in cache:
        if not ref.path.is_file():
            raise ReproduceError(f"sweep {ref.sweep!r} not found")
        try:
            sweep = load_sweep(ref.path)
        except ConfigError as err:
            raise ReproduceError(f"{ref.sweep}: {err}") from None
        if sweep.method != "grid":
            raise ReproduceError(f"{ref.sweep}: a reproduction needs a grid sweep (its points are the table's cells)")
        cache[ref.sweep] = (sweep, expand(sweep))
    return cache[ref.sweep]


def _check_overrides(ref: SweepRef, sweep: Sweep, point: dict) -> None:
    """An override of conf= on an arm that names its own conf would silently run another method's config."""
    if any(o.startswith("conf=") for o in ref.overrides) and point.get(ARM) in sweep.arms and any(
            w.startswith("conf=") for w in sweep.arms[point[ARM]]):
        raise ReproduceError(f"{ref.sweep}: arm {point[ARM]!r} names its own conf; a column's overrides cannot "
                             "replace it")


def cell_points(table: Table, column_id: str, row, scale: str, cache: dict) -> list[tuple[SweepRef, int, dict]]:
    """(sweep ref, index in the sweep's expansion, point) of every point a row uses in a column at a scale."""
    found = []
    for ref in table.column(column_id).refs[scale] or []:
        sweep, points = _sweep(ref, cache)
        for i, point in enumerate(points):
            if matches(point, ref.where) and any(matches(point, f) for f in row.points):
                _check_overrides(ref, sweep, point)
                found.append((ref, i, point))
    return found


def build_plan(paper: Paper, tables: list[Table], scale: str, seeds: list[int], out: Path,
               extra: list[str], every_cell: bool = False, baselines_only: bool = False) -> Plan:
    """Every job the tables' cells need at `scale` (at twin scale those within the budget unless `every_cell`; only
    each table's reference-baseline rows with `baselines_only`); ReproduceError when a cell's sweep, points or configs
    are bad."""
    plan, cache = Plan(scale, seeds), {}
    extra = [*TWIN_EXTRA, *extra] if scale == "twin" else list(extra)
    judged = judged_cells(paper, scale) if scale == "twin" and not baselines_only else set()
    for table in tables:
        for column in table.columns:
            refs = column.refs[scale]
            for row in table.rows:
                key = CellKey(table.id, column.id, row.method)
                if baselines_only and row.method not in table.baselines:
                    continue  # --baselines: a twin's calibration, not the table
                if refs is None:
                    plan.not_run[key] = column.notes[scale] or f"no {scale} sweep for this column"
                    continue
                if scale == "twin" and row.method in column.twin_skip:
                    plan.not_run[key] = f"cannot run on the twin: {column.twin_skip[row.method]}"
                    continue
                if scale == "twin" and not every_cell and not column.in_budget(row.method):
                    plan.not_run[key] = ("left to --scale paper (or --every-cell): outside the 40-minute twin budget"
                                         + (f"; {column.notes[scale]}" if column.notes[scale] else ""))
                    continue
                found = cell_points(table, column.id, row, scale, cache)
                if not found:
                    plan.not_run[key] = (row.note or column.notes[scale]
                                         or f"no point of the column's {scale} sweeps is this row's")
                    continue
                if len(found) > 1 and not table.select:
                    raise ReproduceError(f"{paper.path.name}: {table.id}/{column.id}/{row.method}: {len(found)} points "
                                         "and no select: to pick a variant per seed")
                plan.cells[key] = [job for ref, i, point in found
                                   for job in _jobs(plan, ref, i, point, seeds, out, extra, cache)]
                if key in judged:
                    plan.doubled[key] = [job for ref, i, point in found
                                         for job in _doubled(plan, key, ref, i, point, out, extra, cache)]
    for group in plan.groups.values():
        try:
            check_reuse(list(group.jobs.values()))
        except ConfigError as err:
            raise ReproduceError(str(err)) from None
    return plan


def _doubled(plan: Plan, key: CellKey, ref: SweepRef, index: int, point: dict, out: Path, extra: list[str],
             cache: dict) -> list[Job]:
    """A point's run of the plan's first seed at DOUBLED times the rounds its own run trains (in a folder of its own:
    the overrides' slug)."""
    seed = plan.seeds[0]
    own = next(j for j in plan.cells[key] if j.point_id == point_id(index, point) and j.seed == seed)
    rounds = DOUBLED * own.config["trainer.rounds"]
    longer = SweepRef(ref.sweep, ref.where, (*ref.overrides, f"trainer.rounds={rounds}"))
    jobs = _jobs(plan, longer, index, point, [seed], out, extra, cache)
    plan.groups[jobs[0].run_dir.parent.name].longer_than = own.run_dir.parent.name
    return jobs


def _jobs(plan: Plan, ref: SweepRef, index: int, point: dict, seeds: list[int], out: Path, extra: list[str],
          cache: dict) -> list[Job]:
    sweep, _ = cache[ref.sweep]
    folder = out / "runs" / f"{sweep.name}{_slug(ref.overrides)}"
    group = plan.groups.setdefault(folder.name, Group(ref, sweep, folder, [*extra, *ref.overrides]))
    names = [f"{point_id(index, point)}-s{seed}" for seed in seeds]
    if None not in seeds and all(n in group.jobs for n in names):  # another cell's point: planned and checked once
        return [group.jobs[n] for n in names]
    try:
        jobs = plan_points(sweep, [point], folder, seeds, group.extra, indices=[index])
    except ConfigError as err:
        raise ReproduceError(f"{ref.sweep}: {err}") from None
    return [group.jobs.setdefault(j.run_dir.name, j) for j in jobs]
