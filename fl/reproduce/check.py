"""`python -m fl.reproduce PAPER --check [--runs N] [--record FILE]`: does the committed output still come from the
code? It re-runs the N cheapest recorded runs (by their recorded CPU time, else the time --dry-run projects) from an
empty scratch folder, planned from the record's own settings (tables, seeds, key=value arguments), and compares
every metric the record holds for them with the new run's, bit for bit (a float in JSON round-trips exactly), but
the wall-clock ones (time/round_s), which no run repeats. Exit 0
when every one is equal; 1 naming the first difference (a run no longer planned, other overrides or another resolved
config, a metric that moved, a run that fails now), the scratch folder kept for a look; 2 when there is no record
or it cannot be read. The record is bench/reproduce/PAPER.json (the committed output's reproduce.json) unless
--record names another."""
from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path
from typing import Optional

from fl.report.runs import BadRun, load_run_dir
from fl.reproduce.cells import CellKey, run_value
from fl.reproduce.paper import ROOT, SCALES, Paper, ReproduceError
from fl.reproduce.plan import build_plan
from fl.reproduce.record import config_hash, provenance, run_argv, run_key
from fl.reproduce.timing import twin_seconds
from fl.sweep.runner import run_jobs

RECORDS = ROOT / "bench" / "reproduce"
CLOCK = "time/"  # wall-clock metrics (time/round_s): measured, never reproducible; every other metric is compared


def compared(final: dict) -> dict:
    return {k: v for k, v in final.items() if not k.startswith(CLOCK)}


def read_record(paper: Paper, record: Optional[str]) -> tuple[Path, dict]:
    path = Path(record) if record else RECORDS / f"{paper.id}.json"
    if not path.is_file():
        raise ReproduceError(f"no record {path}: `python -m fl.reproduce {paper.id}` writes one "
                             f"(OUT/{paper.id}/SCALE/reproduce.json), bench/reproduce/{paper.id}.json is the committed "
                             "one; give it with --record FILE")
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ReproduceError(f"{path}: cannot read the record: {str(err).splitlines()[0]}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list) or not isinstance(doc.get("command"), dict):
        raise ReproduceError(f"{path}: not a reproduction's record (reproduce.json with 'command' and 'runs'); a "
                             "reproduce.json written before --check existed has no runs: run the reproduction again")
    if doc.get("paper") != paper.id or doc.get("scale") not in SCALES:
        raise ReproduceError(f"{path} records paper {doc.get('paper')!r} at scale {doc.get('scale')!r}, not "
                             f"{paper.id!r}")
    return path, doc


def cheapest(doc: dict, n: int) -> list[dict]:
    """The n finished runs of the record with the least recorded CPU time (else wall time, else --dry-run's
    projection for its point; a run with none comes last), in that order."""
    projected, _ = twin_seconds() if doc["scale"] == "twin" else ({}, "")

    def seconds(entry: dict) -> float:
        recorded = entry.get("seconds") or {}
        value = recorded.get("cpu_s") or recorded.get("wall_s")
        if value is None:
            value = projected.get(entry["run"].rsplit("-s", 1)[0])
        return math.inf if value is None else float(value)

    finished = [e for e in doc["runs"] if e.get("status") in ("finished", "diverged") and "final" in e]
    return sorted(finished, key=lambda e: (seconds(e), e["run"]))[:n]


def same(a, b) -> bool:
    """Bitwise equality of two recorded values (NaN equals NaN: a metric that was NaN must stay NaN)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def first_difference(paper: Paper, entry: dict, job, run) -> Optional[str]:
    """What differs between a recorded run and its re-run (None: every recorded value is equal)."""
    name = entry["run"]
    if run is None:
        return f"{name}: it finished in the record and fails now; its log: " \
               f"{job.run_dir.parent / 'logs' / (job.run_dir.name + '.log')}"
    if bool(entry.get("diverged")) != bool(run.diverged):
        return f"{name}: diverged {entry.get('diverged')!r} in the record, {run.diverged!r} now"
    final, recorded = compared(run.summary.get("final", {})), compared(entry["final"])
    for key in sorted(set(recorded) | set(final)):
        if key not in final or key not in recorded or not same(recorded[key], final[key]):
            return f"{name}: final {key}: recorded {recorded.get(key, 'absent')!r}, now {final.get(key, 'absent')!r}"
    for label, value in sorted(entry.get("selected", {}).items()):
        table_id, column_id, row_id = label.split("/", 2)
        table = paper.table(table_id)
        column, row = table.column(column_id), table.row(row_id)
        now = run_value(run, table.metric_of(column, row), table.stat, table.select)
        now = None if now is None else now * table.factor
        if now is None or not same(value, now):
            return f"{name}: its value in {CellKey(table_id, column_id, row_id)}: recorded {value!r}, now {now!r}"
    return None


def check(paper: Paper, record: Optional[str], runs: int, parallel: int) -> int:
    path, doc = read_record(paper, record)
    command = doc["command"]
    chosen = cheapest(doc, runs)
    if not chosen:
        raise ReproduceError(f"{path} records no finished run to check")
    then, now = doc.get("provenance") or {}, provenance()
    print(f"checking {len(chosen)} of the {len(doc['runs'])} runs {path} records (the cheapest first: "
          f"{', '.join(e['run'] for e in chosen)})")
    print(f"recorded at commit {then.get('commit')}{' with changes' if then.get('dirty') else ''}, now "
          f"{now['commit']}{' with changes' if now['dirty'] else ''}")
    moved = {k: (v, now['versions'].get(k)) for k, v in (then.get("versions") or {}).items()
             if v != now["versions"].get(k)}
    for key in ("python", "machine", "cpu_capability"):
        if then.get(key) != now.get(key):
            moved[key] = (then.get(key), now.get(key))
    if moved:
        print("note: not as recorded: " + "; ".join(f"{k} {a} then, {b} now" for k, (a, b) in sorted(moved.items())))
    scratch = Path(tempfile.mkdtemp(prefix=f"fl-reproduce-check-{paper.id}-"))
    tables = [paper.table(command["table"])] if command.get("table") else paper.tables
    plan = build_plan(paper, tables, doc["scale"], list(doc["seeds"]), scratch / paper.id / doc["scale"],
                      list(command.get("overrides", [])), bool(command.get("every_cell")),
                      bool(command.get("baselines")))
    jobs = {run_key(j.run_dir): j for j in plan.jobs}
    difference = None
    for entry in chosen:
        job = jobs.get(entry["run"])
        if job is None:
            difference = f"{entry['run']}: the paper file no longer plans this run"
        elif run_argv(job) != entry.get("overrides"):
            difference = (f"{entry['run']}: its overrides changed: recorded {' '.join(entry.get('overrides', []))}, "
                          f"now {' '.join(run_argv(job))}")
        elif config_hash(job.config) != entry.get("config_sha1"):
            difference = (f"{entry['run']}: the same overrides resolve to another config now (a conf/ file or a "
                          "default changed)")
        if difference:
            break
    if difference is None:
        selected = [jobs[e["run"]] for e in chosen]
        run_jobs(None, selected, [], parallel)
        for entry, job in zip(chosen, selected):
            try:
                run = load_run_dir(job.run_dir) if job.finished else None
            except BadRun as err:
                difference = f"{entry['run']}: its re-run cannot be read: {err}"
                break
            difference = first_difference(paper, entry, job, run)
            if difference:
                break
    if difference:
        print(f"DIFFERS: {difference}")
        print(f"the re-runs are kept in {scratch}")
        return 1
    values = sum(len(compared(e["final"])) + len(e.get("selected", {})) for e in chosen)
    print(f"every recorded value of the {len(chosen)} runs is equal, bit for bit ({values} values; the wall-clock "
          f"{CLOCK}* metrics are not compared)")
    shutil.rmtree(scratch, ignore_errors=True)
    return 0
