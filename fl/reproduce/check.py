"""`python -m fl.reproduce PAPER --check [--runs N] [--record FILE]`: does the committed output still come from the
code? It re-runs the N cheapest recorded runs (by their recorded CPU time, else the time --dry-run projects) from an
empty scratch folder, planned from the record's own settings (tables, seeds, key=value arguments), and compares
every value the record holds for them (final metrics but the wall-clock time/round_s, which no run repeats, and cell
values) with the new run's: bit for bit on the float kernels that recorded them (a float in JSON round-trips
exactly), within SPREADS standard deviations of the record's seeds on other kernels (docs/reproduce.md). Exit 0 when
every one passes; 1 listing every value that does not (or naming a run no longer planned, other overrides or another
resolved config, a run that fails now), the scratch folder kept for a look; 2 when there is no record or it cannot be
read. The record is bench/reproduce/PAPER.json (the committed output's reproduce.json) unless --record names
another."""
from __future__ import annotations

import json
import math
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Optional

from fl.report.runs import BadRun, load_run_dir
from fl.reproduce.cells import run_value
from fl.reproduce.paper import ROOT, SCALES, Paper, ReproduceError
from fl.reproduce.plan import DOUBLED, build_plan
from fl.reproduce.record import config_hash, deciding, provenance, run_argv, run_key
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


SPREADS = 3  # off the recording kernels a value may move by this many standard deviations of its recorded seeds


def same_kernels(then: dict, now: dict) -> Optional[str]:
    """None when the recording and this machine run the same float kernels (the same torch, capability, forced
    capability and, where the record has them, instruction-set flags); else what differs, for the message."""
    differ = [f"{label} {a} then, {b} now" for label, a, b in (
        ("torch", (then.get("versions") or {}).get("torch"), (now.get("versions") or {}).get("torch")),
        ("machine", then.get("machine"), now.get("machine")),
        ("torch's CPU capability", then.get("cpu_capability"), now.get("cpu_capability")),
        ("ATEN_CPU_CAPABILITY", then.get("aten_cpu_capability_env"), now.get("aten_cpu_capability_env"))) if a != b]
    flags = [(then.get("cpu") or {}).get("flags"), (now.get("cpu") or {}).get("flags")]
    if None not in flags and set(flags[0]) != set(flags[1]):
        differ.append(f"CPU flags {' '.join(flags[0]) or '-'} then, {' '.join(flags[1]) or '-'} now")
    return "; ".join(differ) or None


def run_problem(entry: dict, job, run) -> Optional[str]:
    """Why a recorded run's re-run cannot be compared value by value (None: it can)."""
    name = entry["run"]
    if run is None:
        return f"{name}: it finished in the record and fails now; its log: " \
               f"{job.run_dir.parent / 'logs' / (job.run_dir.name + '.log')}"
    if bool(entry.get("diverged")) != bool(run.diverged):
        return f"{name}: diverged {entry.get('diverged')!r} in the record, {run.diverged!r} now"
    return None


def recorded_values(entry: dict) -> dict[str, object]:
    """What a record holds of a run, by name: its final metrics but the wall-clock ones, and each cell value it was
    selected for (`cell T/C/R`, in the paper's units)."""
    return {**{f"final {k}": v for k, v in compared(entry.get("final", {})).items()},
            **{f"cell {k}": v for k, v in entry.get("selected", {}).items()}}


def rerun_values(paper: Paper, entry: dict, run) -> dict[str, object]:
    """recorded_values' names, read from the re-run."""
    out = {f"final {k}": v for k, v in compared(run.summary.get("final", {})).items()}
    for label in entry.get("selected", {}):
        table_id, column_id, row_id = label.removesuffix(f"@x{DOUBLED}").split("/", 2)  # a run at twice the budget's
        table = paper.table(table_id)
        now = run_value(run, table.metric_of(table.column(column_id), table.row(row_id)), table.stat, table.select)
        out[f"cell {label}"] = None if now is None else now * table.factor
    return out


def differences(recorded: dict, now: dict) -> list[tuple[str, object, object]]:
    """(name, recorded, now) of every value that is not the same bit for bit, absent on one side included."""
    return [(k, recorded.get(k, "absent"), now.get(k, "absent")) for k in sorted(set(recorded) | set(now))
            if k not in recorded or k not in now or not same(recorded[k], now[k])]


def seed_spread(doc: dict, entry: dict) -> dict[str, float]:
    """Per value name, the standard deviation over the record's finished seeds of the same sweep point (two or more)."""
    def unseeded(e: dict) -> list:
        return [a for a in e.get("overrides", []) if not str(a).startswith("seed=")]

    peers = [recorded_values(e) for e in doc["runs"] if "final" in e and e.get("sweep") == entry.get("sweep")
             and e.get("point") == entry.get("point") and unseeded(e) == unseeded(entry)]
    out = {}
    for key in recorded_values(entry):
        values = [v[key] for v in peers if isinstance(v.get(key), (int, float)) and math.isfinite(v[key])]
        if len(values) >= 2:
            out[key] = statistics.stdev(values)
    return out


def _abs(a, b) -> Optional[float]:
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
    return abs(a - b) if numbers else None


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
        elif deciding(run_argv(job)) != deciding(entry.get("overrides") or []):
            difference = (f"{entry['run']}: its overrides changed: recorded {' '.join(entry.get('overrides', []))}, "
                          f"now {' '.join(run_argv(job))}")
        elif config_hash(job.config) != entry.get("config_sha1"):  # the record keeps a hash: which key is unknown
            print(f"note: {entry['run']}: the same overrides resolve to another config now (a conf/ file or a default "
                  "changed, or a setting was added since); its re-run's values decide")
        if difference:
            break
    if difference is None:
        selected = [jobs[e["run"]] for e in chosen]
        run_jobs(None, selected, [], parallel)
        reruns = []
        for entry, job in zip(chosen, selected):
            try:
                run = load_run_dir(job.run_dir) if job.finished else None
            except BadRun as err:
                difference = f"{entry['run']}: its re-run cannot be read: {err}"
                break
            difference = run_problem(entry, job, run)
            if difference:
                break
            reruns.append((entry, rerun_values(paper, entry, run)))
    if difference:
        print(f"DIFFERS: {difference}")
        print(f"the re-runs are kept in {scratch}")
        return 1
    values = sum(len(recorded_values(e)) for e in chosen)
    kernels = same_kernels(then, now)
    if kernels is None:
        differ = [(e["run"], *d) for e, values_now in reruns for d in differences(recorded_values(e), values_now)]
        if differ:
            print(f"DIFFERS: {len(differ)} of the {values} recorded values, on the kernels that recorded them:")
            for run, key, a, b in differ:
                gap = _abs(a, b)
                print(f"  {run}: {key}: recorded {a!r}, now {b!r}"
                      + ("" if gap is None else f" (|difference| {gap:.3g})"))
            print(f"the re-runs are kept in {scratch}")
            return 1
        print(f"every recorded value of the {len(chosen)} runs is equal, bit for bit ({values} values; the wall-clock "
              f"{CLOCK}* metrics are not compared)")
        shutil.rmtree(scratch, ignore_errors=True)
        return 0
    return within_seed_spread(doc, reruns, kernels, values, scratch)


def within_seed_spread(doc: dict, reruns: list, kernels: str, values: int, scratch: Path) -> int:
    """Off the recording kernels: each value's largest |difference| over the re-runs against SPREADS standard
    deviations of its recorded seeds; 0 when every one is within (a value without a spread must be equal)."""
    print(f"note: the float kernels differ from the recording's ({kernels}): the runs are compared within "
          f"{SPREADS} standard deviations of each value's recorded seeds, not bit for bit (docs/reproduce.md)")
    worst: dict[str, tuple[float, Optional[float], str]] = {}  # name -> (largest |difference|, tolerance, run)
    failed = []
    for entry, now in reruns:
        spread = seed_spread(doc, entry)
        for key, a, b in differences(recorded_values(entry), now):
            gap, tol = _abs(a, b), (SPREADS * spread[key] if key in spread else None)
            if gap is None or not math.isfinite(gap) or tol is None or gap > tol:
                failed.append(f"  {entry['run']}: {key}: recorded {a!r}, now {b!r}; " + (
                    "no recorded seed spread to judge it by (one seed of its point)" if tol is None and gap is not None
                    else "not a number on both sides" if gap is None or not math.isfinite(gap)
                    else f"|difference| {gap:.3g} > {SPREADS} x its seed std {spread[key]:.3g}"))
            if gap is not None and math.isfinite(gap) and gap > worst.get(key, (-1.0,))[0]:
                worst[key] = (gap, tol, entry["run"])
    if worst:
        print(f"{len(worst)} of the values moved; the largest |difference| of each, and its tolerance:")
        for key, (gap, tol, run) in sorted(worst.items()):
            print(f"  {key}: {gap:.3g} (tolerance {'none' if tol is None else f'{tol:.3g}'}; {run})")
    if failed:
        print(f"DIFFERS beyond the tolerance: {len(failed)} value(s):")
        print("\n".join(failed))
        print(f"the re-runs are kept in {scratch}")
        return 1
    print(f"every recorded value of the {len(reruns)} runs is within {SPREADS} seed standard deviations of the record "
          f"({values} values, {len(worst)} of them moved; the kernels differ, so bit for bit is not expected)")
    shutil.rmtree(scratch, ignore_errors=True)
    return 0
