"""What the default evaluators cost per evaluating round, against a training round (issue 45 item 1).

Each workload runs as `python -m fl.train` at one intra-op thread, once per setting of the adaptability diagnostic
(FedMosaic's twin: per list of evaluators), the settings interleaved over --repeats. From each run's metrics.jsonl:
a round's training seconds are time/round_s less time/eval_s and time/evaluators_s (the loop's own split,
fl/core/loop.py; evaluators_s includes the local-model scoring right after each client's training); the table gives,
per setting, the median training round, the median evaluators' seconds on the rounds where the adaptability
diagnostic ran and on the other evaluating rounds, and the first as a share of a training round, with the risk
and its logged standard error on the last round.

    python bench/adaptability_cost.py [--repeats 3] [--workloads quickstart fedacd_twin fedmosaic_twin] [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SHARDS = "evaluators.adaptability.test_shards=20"
ADAPTABILITY = {  # name -> the adaptability diagnostic's settings
    "whole set (test_shards=1)": ["evaluators.adaptability.test_shards=1"],
    "test_shards=20 (the default: a shard per client)": [SHARDS],
    "test_shards=20, train_per_class=32": [SHARDS, "evaluators.adaptability.train_per_class=32"],
    "test_shards=20, train_per_class=8": [SHARDS, "evaluators.adaptability.train_per_class=8"],
}
EVALUATORS = {  # FedMosaic's twin, 30 clients with models of their own: the system vote is a test pass per client
    "the protocol's: the default evaluators less system": [],
    "every default evaluator (trainer.evaluators=null)": ["trainer.evaluators=null"],
}
WORKLOADS = {  # name -> fl.train arguments, the settings compared
    "quickstart": ([], ADAPTABILITY),
    "fedacd_twin": (["conf=fedacd_cifar10_dir03_synthetic", "trainer.rounds=5"], ADAPTABILITY),
    "fedmosaic_twin": (["conf=fedmosaic_domainnet_synthetic", "trainer.rounds=5", "trainer.eval_every=5"], EVALUATORS),
}


def run(args: list[str], out: Path, threads: int) -> list[dict]:
    cmd = [sys.executable, "-m", "fl.train", *args, f"fabric.cpu_threads={threads}", "logger.wandb.mode=disabled",
           "logger.progress=false", f"logger.output_dir={out}", "logger.run_name=run", f"data.root={ROOT / 'data'}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{' '.join(args)}: exit {res.returncode}\n{res.stderr[-2000:]}")
    return [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]


def split(rows: list[dict]) -> dict[str, list[float]]:
    timed = [r for r in rows if "time/round_s" in r]
    training = [r["time/round_s"] - r.get("time/eval_s", 0.0) - r.get("time/evaluators_s", 0.0) for r in timed]
    evaluating = [r for r in timed if "time/eval_s" in r and "test/acc_mean_clients" in r]
    return {"training": training,
            "adaptability": [r["time/evaluators_s"] for r in evaluating if "test/adaptability" in r],
            "other": [r["time/evaluators_s"] for r in evaluating if "test/adaptability" not in r]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--threads", type=int, default=1)
    opts = ap.parse_args()
    for workload in opts.workloads:
        args, settings = WORKLOADS[workload]
        seen = {name: {"training": [], "adaptability": [], "other": [], "last": None} for name in settings}
        for _ in range(opts.repeats):
            for name, extra in settings.items():  # interleaved: a drift in the machine's speed hits both alike
                with tempfile.TemporaryDirectory() as tmp:
                    rows = run([*args, *extra], Path(tmp), opts.threads)
                for kind, values in split(rows).items():
                    seen[name][kind] += values
                seen[name]["last"] = next(r for r in reversed(rows) if "test/adaptability" in r)
        print(f"\n{workload}: {' '.join(args) or 'the quickstart'}, {opts.threads} thread(s), "
              f"{opts.repeats} runs a setting")
        print("| setting | training round (s) | evaluators, adaptability round (s) | share of a training round "
              "| evaluators, other evaluating rounds (s) | test/adaptability | test/adaptability_se |")
        print("|---|---|---|---|---|---|---|")
        for name, s in seen.items():
            train, adapt = statistics.median(s["training"]), statistics.median(s["adaptability"])
            other = f"{statistics.median(s['other']):.3f}" if s["other"] else "-"
            last = s["last"]
            se = f"{last['test/adaptability_se']:.4f}" if "test/adaptability_se" in last else "- (nothing sampled)"
            print(f"| {name} | {train:.3f} | {adapt:.3f} | {adapt / train:.0%} | {other} "
                  f"| {last['test/adaptability']:.4f} | {se} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
