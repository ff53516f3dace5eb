"""What warm workers save a reproduction (fl/sweep/warm_worker.py, issue 45 item 2): `python -m fl.reproduce PAPER
--check --runs N --parallel P` with each run in a warm process (the default) and with each run its own process
(FL_FRESH_PROCESSES=1), interleaved over --repeats, each from an empty scratch folder. --check re-runs the committed
record's N cheapest runs and compares every value with the record (made with a process per run): both variants
must pass bit for bit. Prints each variant's wall times, their median and the ratio.

    python bench/warm_workers.py [--paper fedpals] [--runs 10] [--parallel 2] [--repeats 2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(paper: str, runs: int, parallel: int, fresh: bool) -> tuple[float, bool, str]:
    env = {**os.environ, "FL_FRESH_PROCESSES": "1" if fresh else "0"}
    start = time.time()
    res = subprocess.run([sys.executable, "-m", "fl.reproduce", paper, "--check", "--runs", str(runs), "--parallel",
                          str(parallel)], cwd=ROOT, env=env, capture_output=True, text=True)
    last = (res.stdout.strip().splitlines() or ["(no output)"])[-1]
    return time.time() - start, res.returncode == 0, last


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--paper", default="fedpals")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    a = p.parse_args()
    times: dict[str, list[float]] = {"warm": [], "fresh": []}
    for i in range(a.repeats):
        order = ("warm", "fresh") if i % 2 == 0 else ("fresh", "warm")
        for variant in order:
            seconds, ok, last = timed(a.paper, a.runs, a.parallel, variant == "fresh")
            print(f"{variant:5s} {seconds:6.1f} s  {'check passed' if ok else 'CHECK FAILED'}: {last}", flush=True)
            if not ok:
                return 1
            times[variant].append(seconds)
    warm, fresh = (statistics.median(times[v]) for v in ("warm", "fresh"))
    print(f"\n{a.paper} --check --runs {a.runs} --parallel {a.parallel}: warm workers {warm:.1f} s, a process per "
          f"run {fresh:.1f} s (medians of {a.repeats}); warm / fresh = {warm / fresh:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
