"""The budget of `python -m fl.reproduce PAPER --scale twin`: each paper's wall time from an empty output folder, with
the machine's load average sampled beside it, each run's own wall time, and where the runs' time went (training,
evaluation, evaluators, and the process's start-up, set-up, checkpoints and exit).

    python bench/reproduce_budget.py [PAPER ...] [--seeds 3] [--parallel N] [--out DIR] [--record] [--publish]
                                     [key=value ...]

Without papers it times every paper one after the other (what `--all` runs). The budget (issue 46, with the budget
check's runs at twice the rounds; issue 33 had 40 minutes and 2.5 hours without them): one paper within 60 minutes
and all five within 4 hours on the 2-core CPU with 3 seeds.
Timings taken while other work shares the CPU are inflated: the load average printed beside each figure says how
much. `--record` writes the per-run medians to fl/reproduce/twin_seconds.json, which `python -m fl.reproduce PAPER
--dry-run` projects from; `--seeds 1` measures every cell's run once (a third of the full command's runs).
`--publish` copies each paper's output that exited 0, reproduce.md and its record reproduce.json, to
bench/reproduce/PAPER.md and PAPER.json (what `python -m fl.reproduce PAPER --check` re-runs from), the Markdown
under a line naming the command, the day and the commit.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from fl.reproduce.check import RECORDS  # noqa: E402
from fl.reproduce.spec import available_papers  # noqa: E402
from fl.reproduce.timing import TWIN_SECONDS, duration  # noqa: E402

BUDGET_ONE, BUDGET_ALL = 60 * 60, 240 * 60


class LoadSampler(threading.Thread):
    """The 1-minute load average every `every` seconds while a paper runs."""

    def __init__(self, every: float = 10.0):
        super().__init__(daemon=True)
        self.every, self.samples, self.stopped = every, [os.getloadavg()[0]], threading.Event()

    def run(self):
        while not self.stopped.wait(self.every):
            self.samples.append(os.getloadavg()[0])


def time_paper(paper: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "fl.reproduce", paper, "--scale", "twin", "--seeds", str(args.seeds),
           "--out", str(args.out), *(["--parallel", str(args.parallel)] if args.parallel else []), *args.overrides]
    sampler = LoadSampler()
    sampler.start()
    start = time.time()
    with open(args.out / f"{paper}.log", "w") as log:
        code = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}).returncode
    wall = time.time() - start
    sampler.stopped.set()
    timings = args.out / paper / "twin" / "timings.json"
    runs = json.loads(timings.read_text())["runs"] if timings.is_file() else {}
    runs = {k: v if isinstance(v, dict) else {"wall_s": v} for k, v in runs.items()}  # files before CPU times
    return {"paper": paper, "exit": code, "wall_s": wall, "runs": runs,
            "load_mean": statistics.mean(sampler.samples), "load_max": max(sampler.samples)}


PHASES = ("training", "evaluation", "evaluators", "start-up, set-up, checkpoints and exit")


def phases(paper: str, args: argparse.Namespace, runs: dict[str, dict]) -> dict[str, float]:
    """The timed runs' wall time split, summed over them: each round's time/round_s less its evaluation (time/eval_s:
    the clients' and the global model's) and its evaluators (time/evaluators_s: their evaluate and on_local_model)
    is training (local steps, uploads, the server step); the run's wall time less its rounds is the process's
    start-up (the interpreter and imports when not in a warm worker), the set-up before round 0, the checkpoints,
    the summary and the exit."""
    out = dict.fromkeys(PHASES, 0.0)
    for name, times in runs.items():
        path = args.out / paper / "twin" / "runs" / name / "metrics.jsonl"
        if times.get("wall_s") is None or not path.is_file():
            continue
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        rounds, evaluation, evaluators = (sum(r.get(f"time/{k}_s", 0.0) for r in rows)
                                          for k in ("round", "eval", "evaluators"))
        out["training"] += rounds - evaluation - evaluators
        out["evaluation"] += evaluation
        out["evaluators"] += evaluators
        out[PHASES[-1]] += times["wall_s"] - rounds
    return out


def per_point(runs: dict[str, dict], key: str) -> dict[str, float]:
    """<run folder>/<point id>-s<seed> -> {wall_s, cpu_s} becomes <run folder>/<point id> -> the median of `key`
    over its seeds."""
    by: dict[str, list[float]] = {}
    for name, times in runs.items():
        if times.get(key) is not None:
            by.setdefault(re.sub(r"-s\d+$", "", name), []).append(times[key])
    return {k: round(statistics.median(v), 1) for k, v in sorted(by.items())}


def record(results: list[dict], args: argparse.Namespace) -> None:
    """The per-point medians, CPU time as `seconds` (what --dry-run projects: on a core of its own, a run's wall time
    is its CPU time, whatever else shared the CPU while it was measured) and the wall time measured beside it."""
    old = json.loads(TWIN_SECONDS.read_text()) if TWIN_SECONDS.is_file() else {}
    cpu = {**old.get("seconds", {}), **{k: v for r in results for k, v in per_point(r["runs"], "cpu_s").items()}}
    wall = {**old.get("wall_seconds", {}), **{k: v for r in results for k, v in per_point(r["runs"], "wall_s").items()}}
    day = f"{datetime.now(timezone.utc):%Y-%m-%d}"
    how = {**old.get("how", {}), **{r["paper"]: f"{day}, {args.seeds} seed(s), mean load average {r['load_mean']:.1f}"
                                    for r in results}}  # per paper: the last recording of its points
    papers = "; ".join(f"{k}: {v}" for k, v in sorted(how.items()))
    measured = (f"measured by bench/reproduce_budget.py on {os.cpu_count()} CPU cores, --parallel "
                f"{args.parallel or os.cpu_count()}, fabric.cpu_threads=1; seconds: each point's median CPU time "
                f"(user + system), wall_seconds: its median wall time; {papers}")
    TWIN_SECONDS.write_text(json.dumps({"measured": measured, "how": how, "seconds": cpu, "wall_seconds": wall},
                                       indent=1) + "\n")
    print(f"wrote {TWIN_SECONDS} ({len(cpu)} points)", file=sys.stderr)  # stdout is the table


def publish(paper: str, args: argparse.Namespace) -> None:
    """The paper's reproduce.md and reproduce.json (its record) into bench/reproduce/, as the command wrote them."""
    out = args.out / paper / "twin"
    record = json.loads((out / "reproduce.json").read_text())
    prov = record.get("provenance") or {}
    commit = (prov.get("commit") or "unknown")[:12] + (" with uncommitted changes" if prov.get("dirty") else "")
    command = " ".join(["python -m fl.reproduce", paper, "--scale twin", f"--seeds {args.seeds}", *args.overrides])
    day = f"{datetime.now(timezone.utc):%Y-%m-%d}"
    head = (f"<!-- What `{command}` wrote as reproduce.md on {day} at commit {commit}, on {os.cpu_count()} CPU cores "
            f"(bench/reproduce_budget.py --publish); `runs/` were under {out}. Every run's record is {paper}.json "
            f"beside this file: `python -m fl.reproduce {paper} --check` re-runs from it. -->\n\n")
    RECORDS.mkdir(parents=True, exist_ok=True)
    (RECORDS / f"{paper}.md").write_text(head + (out / "reproduce.md").read_text())
    (RECORDS / f"{paper}.json").write_text((out / "reproduce.json").read_text())
    print(f"wrote {RECORDS / (paper + '.md')} and {RECORDS / (paper + '.json')}", file=sys.stderr)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("args", nargs="*", metavar="PAPER|key=value",
                   help=f"papers (default: all of {', '.join(available_papers())}) and key=value for every run")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--parallel", type=int, help="default: fl.reproduce's (the CPU count)")
    p.add_argument("--out", type=Path, default=Path("/tmp/fl_reproduce_budget"), help="an empty folder per timing")
    p.add_argument("--record", action="store_true", help="write the per-run medians to fl/reproduce/twin_seconds.json")
    p.add_argument("--publish", action="store_true",
                   help="copy each paper's reproduce.md and reproduce.json (its record) to bench/reproduce/")
    args = p.parse_intermixed_args()
    args.papers = [a for a in args.args if "=" not in a]
    args.overrides = [a for a in args.args if "=" in a]
    bad = [x for x in args.papers if x not in available_papers()]
    if bad:
        p.error(f"{bad[0]} is not a paper; choices: {', '.join(available_papers())}")
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    print("| paper | runs timed | wall | budget | CPU time of the runs | load average (mean / max) | exit |\n"
          "|---|---|---|---|---|---|---|")
    for paper in args.papers or available_papers():
        r = time_paper(paper, args)
        results.append(r)
        ok = f"{'within' if r['wall_s'] <= BUDGET_ONE else 'OVER'} {BUDGET_ONE // 60} min"
        cpu = sum(t.get("cpu_s") or 0.0 for t in r["runs"].values())
        print(f"| {paper} | {len(r['runs'])} | {duration(r['wall_s'])} | {ok} | {duration(cpu)} | "
              f"{r['load_mean']:.1f} / {r['load_max']:.1f} | {r['exit']} |", flush=True)
        # each paper as soon as it ends: a long command stopped half-way keeps the papers it finished
        if args.record:
            record([r], args)
        if args.publish:
            if r["exit"] == 0:
                publish(r["paper"], args)
            else:
                print(f"{r['paper']} exited {r['exit']}: not published", file=sys.stderr)
    if len(results) > 1:
        total = sum(r["wall_s"] for r in results)
        print(f"| all | {sum(len(r['runs']) for r in results)} | {duration(total)} | "
              f"{'within' if total <= BUDGET_ALL else 'OVER'} {BUDGET_ALL // 3600} h | | | |")
    print("\nWhere the runs' wall time went (summed over the timed runs; share of their wall time):\n\n"
          f"| paper | {' | '.join(PHASES)} |\n|---|{'---|' * len(PHASES)}")
    for r in results:
        split = phases(r["paper"], args, r["runs"])
        whole = sum(split.values()) or 1.0
        print(f"| {r['paper']} | " + " | ".join(f"{duration(v)} ({100 * v / whole:.0f}%)" for v in split.values())
              + " |")
    return max(r["exit"] for r in results)


if __name__ == "__main__":
    sys.exit(main())
