"""`python -m fl.reproduce PAPER`: a seed paper's headline tables and claims, regenerated and printed beside the
paper's own numbers.

    python -m fl.reproduce PAPER [--table ID] [--scale twin|paper] [--seeds N] [--dry-run] [--every-cell]
                                 [--parallel N] [--out DIR] [key=value ...]
    python -m fl.reproduce --all [--scale twin|paper] [--seeds N] [--dry-run] ...
    python -m fl.reproduce PAPER --check [--runs N] [--record FILE] [--parallel N]

The paper's numbers and claims are data (fl/reproduce/papers/PAPER.yaml). The command runs the runs that are missing
through fl.sweep's runner (a finished run is reused, a run made with another config stops the command; W&B groups
are the sweep runner's, sweep-<name>), then prints per table our mean ± std beside the paper's, both ranks and
Spearman's rho, and each claim's verdict (HOLDS / FAILS / UNRESOLVED) with its numbers, and writes reproduce.md,
reproduce.html (with fl.report's plots) and reproduce.json (the cells, the verdicts and every run's record: overrides,
seed, selected and final metrics, commit and package versions) under OUT/PAPER/SCALE/. `--scale twin` runs the synthetic
twins on the embedded data on a CPU (each run with one intra-op thread, --parallel of them at once), the cells that fit
its time budget unless --every-cell; `--scale paper` runs the paper's configs on the real datasets (a GPU's work; a
missing dataset stops it in one line saying where to get it). `--dry-run` lists the runs and their projected time and
runs nothing. key=value arguments go to every run. `--check` re-runs the N cheapest runs of a record
(bench/reproduce/PAPER.json unless --record) in a scratch folder and compares every recorded value: bit for bit on
the recording's float kernels, within the record's seed spread on others (fl/reproduce/check.py). Two invocations
into one --out each take a run's lock before training it: the second waits and reuses what the first trains.
Exit codes: 0 done (--check: every value passes), 1 some run failed (--check: every value that does not), 2 bad input
(one line, nothing run), 130 interrupted.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from fl.report.groups import group_runs
from fl.report.plots import all_figures
from fl.report.runs import BadRun, load_run_dir
from fl.reproduce.cells import Cell, make_cell
from fl.reproduce.check import check
from fl.reproduce.claim_cells import cells_of
from fl.reproduce.claims import evaluate
from fl.reproduce.compare import column_view
from fl.reproduce.paper import ROOT, SCALES, Paper, ReproduceError
from fl.reproduce.plan import DOUBLED, Plan, build_plan
from fl.reproduce.record import run_records, write_json, write_timings
from fl.reproduce.render import Report, html_page, markdown, summary_lines
from fl.reproduce.setting import setting_lines
from fl.reproduce.spec import available_papers, load_paper
from fl.reproduce.timing import duration, paper_scale, twin_seconds
from fl.sweep.runner import run_jobs

MAX_SEEDS = 100  # the papers use 3 to 8; planning one seed of a paper checks tens of run configs


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (main), instead of argparse's usage block
        raise ReproduceError(message)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = Parser(prog="python -m fl.reproduce", description=__doc__.split("\n\n")[0])
    p.add_argument("paper", nargs="?", help=f"one of {', '.join(available_papers())}")
    p.add_argument("overrides", nargs="*", help="key=value given to every run")
    p.add_argument("--all", action="store_true", help="every paper")
    p.add_argument("--table", help="only this table (its id in the paper's file)")
    p.add_argument("--scale", default="twin", help="twin (embedded data, CPU) or paper (the real datasets)")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 for every cell (default 3)")
    p.add_argument("--dry-run", action="store_true", help="list the runs and their projected time; run nothing")
    p.add_argument("--every-cell", action="store_true",
                   help="--scale twin: every twin cell, beyond the subset that fits the time budget")
    p.add_argument("--baselines", action="store_true",
                   help="only each table's reference baselines (FedAvg, Local, ...): the twin's calibration against "
                        "the paper, in a few minutes (bench/calibrate_twins.py)")
    p.add_argument("--parallel", type=int, help="runs at once (default: the CPU count at twin scale, 1 at paper)")
    p.add_argument("--out", default="outputs/reproduce", help="writes OUT/<paper>/<scale>/")
    p.add_argument("--check", action="store_true",
                   help="re-run the cheapest runs of the paper's record and compare every recorded metric bitwise")
    p.add_argument("--runs", type=int, default=1, help="--check: how many runs (default 1)")
    p.add_argument("--record", help="--check: the record (default bench/reproduce/PAPER.json)")
    args = p.parse_intermixed_args(argv)
    if args.paper and "=" in args.paper:  # argparse took a key=value for the paper name
        args.overrides.insert(0, args.paper)
        args.paper = None
    if args.scale not in SCALES:
        raise ReproduceError(f"--scale {args.scale!r} is not valid; choices: {', '.join(SCALES)}")
    if args.all == bool(args.paper):
        raise ReproduceError(f"give a paper ({', '.join(available_papers())}) or --all, not both")
    if args.all and args.table:
        raise ReproduceError("--table names a table of one paper; give the paper instead of --all")
    if args.check and (args.all or args.dry_run or args.table or args.overrides or args.every_cell or args.baselines):
        raise ReproduceError("--check re-runs a record's runs with the record's own settings; give only the paper, "
                             "--runs, --record and --parallel")
    if args.runs < 1:
        raise ReproduceError("--runs must be >= 1")
    if (args.record or args.runs != 1) and not args.check:
        raise ReproduceError("--runs and --record go with --check")
    if args.seeds < 1 or (args.parallel is not None and args.parallel < 1):
        raise ReproduceError("--seeds and --parallel must be >= 1")
    if args.seeds > MAX_SEEDS:  # each seed is every cell's runs once more, each planned (its config checked) first
        raise ReproduceError(f"--seeds {args.seeds} is more than {MAX_SEEDS}: each seed runs every cell once more; "
                             f"give at most {MAX_SEEDS}")
    blocked = next((a for a in [Path(args.out), *Path(args.out).parents] if a.exists() and not a.is_dir()), None)
    if blocked is not None:
        raise ReproduceError(f"--out {args.out}: {blocked} is a file, not a folder; give a folder (it is created if "
                             "missing)")
    bad = [o for o in args.overrides if "=" not in o or o.startswith("=")]
    if bad:
        raise ReproduceError(f"argument {bad[0]!r} is not key=value")
    if args.parallel is None:
        args.parallel = (os.cpu_count() or 1) if args.scale == "twin" else 1
    return args


# ---- dry run -------------------------------------------------------------------------------------------------
def not_run_lines(paper: Paper, plan: Plan) -> list[str]:
    """What is not run at this scale, one line per column and reason (naming the rows unless it is all of them)."""
    by: dict = {}
    for key, why in plan.not_run.items():
        by.setdefault((key.table, key.column, why), []).append(key.row)
    lines = []
    for (table, column, why), rows in by.items():
        every = len(rows) == len(paper.table(table).rows)
        lines.append(f"{table}/{column}" + ("" if every else f" ({', '.join(rows)})") + f": {why}")
    return lines


def projection(plan: Plan, group, job, measured: dict, projections: dict) -> tuple[Optional[float], str]:
    """A run's projected seconds and where the figure comes from (fl/reproduce/timing.py)."""
    if plan.scale == "twin":
        seconds = measured.get(f"{group.key}/{job.point_id}")
        if seconds is None and group.longer_than:  # the budget check: twice the rounds of a measured run
            base = measured.get(f"{group.longer_than}/{job.point_id}")
            seconds = None if base is None else DOUBLED * base
            return seconds, (f"{duration(seconds)} each (projected: {DOUBLED}x its measured run at the twin's "
                             "budget)" if seconds is not None else "not measured")
        return seconds, (f"{duration(seconds)} each (measured CPU time)" if seconds is not None
                         else "not measured")
    conf = next((a.split("=", 1)[1] for a in reversed(group.sweep.point_argv(job.point) + group.extra)
                 if a.startswith("conf=")), "?")
    seconds, text = projections.get(conf, (None, f"conf={conf}: no paper-scale projection"))
    return seconds, f"projected {text} each" if seconds else text


def print_dry_run(paper: Paper, plan: Plan, parallel: int) -> None:
    measured, how = twin_seconds() if plan.scale == "twin" else ({}, "")
    projections = paper_scale() if plan.scale == "paper" else {}
    total, unknown, todo = 0.0, 0, 0
    print(f"{paper.id} at --scale {plan.scale}: {len(plan.jobs)} runs ({len(plan.seeds)} seeds) in "
          f"{len(plan.groups)} sweep folders")
    for group in plan.groups.values():
        print(f"  {group.ref.sweep}" + (f" with {' '.join(group.ref.overrides)}" if group.ref.overrides else "")
              + f" -> {group.out}")
        points: dict = {}
        for job in group.jobs.values():
            points.setdefault(job.point_id, []).append(job)
        for pid, jobs in points.items():
            left = [j for j in jobs if not j.finished]
            seconds, text = projection(plan, group, jobs[0], measured, projections)
            todo += len(left)
            total += (seconds or 0.0) * len(left)
            unknown += len(left) if seconds is None else 0
            done = f", {len(jobs) - len(left)} finished (reused)" if len(left) < len(jobs) else ""
            print(f"    {pid}-s{{{','.join(str(j.seed) for j in jobs)}}}: {len(left)} to run{done}; {text}")
    for line in not_run_lines(paper, plan):
        print(f"  not run: {line}")
    source = (f"per-run times {how}" if plan.scale == "twin" else
              "bench/paper_scale.py's projections on the 2-core CPU with evaluators off (bench/README.md), each for "
              "its config's own method")
    print(dry_run_total(todo, unknown, total, parallel) + f"; {source}")


def dry_run_total(todo: int, unknown: int, seconds: float, parallel: int) -> str:
    """The projected time of the runs to go; a run without a measured figure is counted, never taken as 0 s."""
    if todo == 0:
        return "0 runs to go: every run is finished and reused"
    if unknown == todo:
        return f"{todo} runs to go: no projection, none of them has a measured figure"
    known = f"{duration(seconds)} of run time, about {duration(seconds / max(1, parallel))} at --parallel {parallel}"
    return (f"{todo} runs to go: {known}" if not unknown else
            f"{todo} runs to go: {todo - unknown} with a figure, {known}; {unknown} more without one (not counted)")


# ---- results ------------------------------------------------------------------------------------------------
def load_runs(plan: Plan) -> tuple[dict, list[str]]:
    """run dir name -> Run for every finished job, and a note for each one that cannot be read."""
    runs, notes = {}, []
    for job in plan.jobs:
        if not job.finished:
            continue
        try:
            runs[str(job.run_dir)] = load_run_dir(job.run_dir, notes)
        except BadRun as err:
            notes.append(f"skipped {job.run_dir}: {err}")
    return runs, notes


def failure(job) -> str:
    """Why a run has no summary: the last `error:` line of its log (fl.train's one-line reason), else its log."""
    log = job.run_dir.parent / "logs" / f"{job.run_dir.name}.log"
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    error = next((ln for ln in reversed(lines) if ln.startswith("error:")), None)
    return f"seed {job.seed}: {job.run_dir.name} failed: " + (error[len("error:"):].strip() if error else f"see {log}")


def cells(paper: Paper, planned: dict, runs: dict) -> dict:
    """Each planned cell (plan.cells, or plan.doubled) from its finished runs; a run that failed is named in its cell
    with fl.train's reason."""
    results: dict = {}
    for key, jobs in planned.items():
        table = paper.table(key.table)
        column, row = table.column(key.column), table.row(key.row)
        found = [runs[str(j.run_dir)] for j in jobs if str(j.run_dir) in runs]
        cell = make_cell(found, table.metric_of(column, row), table.stat, table.select, table.factor) \
            if found else Cell()
        cell.notes += [failure(j) for j in jobs if not j.finished]
        results[key] = cell
    return results


def figures(paper: Paper, plan: Plan, runs: dict, out: Path) -> dict:
    """fl.report's plots of each table's runs (its metric against round, the clients' spread, traces)."""
    made = {}
    for table in paper.tables:
        mine = {str(j.run_dir) for key, jobs in plan.cells.items() if key.table == table.id for j in jobs}
        chosen = [runs[r] for r in sorted(mine) if r in runs]
        if chosen:
            made[table.id] = all_figures(group_runs(chosen), [table.metric], out / "plots" / table.id)
    return made


def make_plan(paper: Paper, args: argparse.Namespace) -> Plan:
    tables = [paper.table(args.table)] if args.table else paper.tables
    return build_plan(paper, tables, args.scale, list(range(args.seeds)), out_dir(paper, args), args.overrides,
                      args.every_cell, args.baselines)


def out_dir(paper: Paper, args: argparse.Namespace) -> Path:
    return Path(args.out) / paper.id / args.scale


def reproduce(paper: Paper, plan: Plan, args: argparse.Namespace) -> int:
    """Runs what is missing, then compares, judges the claims, prints and writes; the exit code."""
    tables = [paper.table(args.table)] if args.table else paper.tables
    seeds, out = plan.seeds, out_dir(paper, args)
    start, load = time.time(), os.getloadavg()[0]
    failed = run_jobs(None, plan.jobs, [], args.parallel) if plan.jobs else []
    runs, notes = load_runs(plan)
    notes += [f"run {j.run_dir.name} failed; its log: {j.run_dir.parent / 'logs' / (j.run_dir.name + '.log')}"
              for j in failed]
    results, doubled = cells(paper, plan.cells, runs), cells(paper, plan.doubled, runs)
    views = [column_view(t, c, results, plan.not_run) for t in tables for c in t.columns
             if any(k.table == t.id and k.column == c.id for k in results)]
    claim_results = [evaluate(paper, c, results, args.scale, doubled) for c in paper.claims
                     if not args.table or uses_table(c, args.table)]
    left = not_run_lines(paper, plan)
    report = Report(paper, args.scale, seeds, views, claim_results, left, notes,
                    setting=setting_lines(paper, plan, views, results))
    out.mkdir(parents=True, exist_ok=True)
    report.figures = figures(paper, plan, runs, out)
    (out / "reproduce.md").write_text(markdown(report))
    (out / "reproduce.html").write_text(html_page(report))
    timings = write_timings(out / "timings.json", plan, start, load)
    command = {"table": args.table, "seeds": seeds, "overrides": args.overrides, "every_cell": args.every_cell,
               "baselines": args.baselines}
    write_json(out / "reproduce.json", report, results, doubled, command,
               run_records(plan, runs, results, doubled, timings))
    print(markdown(report))
    print("\n".join(summary_lines(report)))
    print(f"wrote {out / 'reproduce.md'}, {out / 'reproduce.html'}, {out / 'reproduce.json'}")
    return 1 if failed else 0


def uses_table(claim, table_id: str) -> bool:
    return any(k.table == table_id for keys in cells_of(claim) for k in keys)


def check_data(plan: Plan) -> None:
    """At paper scale, each dataset is loaded once (python -m fl.data.show) before anything runs: a missing one
    stops the command with the loader's own line (where to get it) rather than failing every run."""
    seen = set()
    for job in plan.jobs:
        argv = (job.sweep.point_argv(job.point) + [f"seed={job.seed}"] + (job.extra or []))
        key = tuple(a for a in argv if a.startswith(("conf=", "data.")))
        if job.finished or key in seen:
            continue
        seen.add(key)
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)  # plugins= may need it
        proc = subprocess.run([sys.executable, "-m", "fl.data.show", *argv], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": path})
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
            raise ReproduceError((lines[-1] if lines else f"fl.data.show exited {proc.returncode}").removeprefix(
                "error: ") + "; nothing was run")


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:  # every paper's file, sweeps and run configs are checked before anything runs
        args = parse_args(argv)
        if args.check:
            return check(load_paper(args.paper), args.record, args.runs, args.parallel)
        papers = [load_paper(p) for p in (available_papers() if args.all else [args.paper])]
        plans = [make_plan(paper, args) for paper in papers]
        if args.scale == "paper" and not args.dry_run:
            for plan in plans:
                check_data(plan)
    except ReproduceError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    if args.dry_run:
        for paper, plan in zip(papers, plans):
            print_dry_run(paper, plan, args.parallel)
        return 0
    code = 0
    try:
        for paper, plan in zip(papers, plans):
            code = max(code, reproduce(paper, plan, args))
    except KeyboardInterrupt:
        print("\ninterrupted; run the same command again to continue (finished runs are reused)", file=sys.stderr)
        return 130
    return code
