"""What an evaluation costs when every client personalises before it is scored (FedBABU, FedAvg-FT, Per-FedAvg,
pFedFDA), each client personalised once per evaluation against once per pass (fl/core/personalized.py).

The workload is a reproduction twin's: FedDRM's CIFAR-10 Dir-0.3 twin as `python -m fl.reproduce feddrm` runs it (8
clients, a 10% validation split, the system-accuracy evaluator on the test and the validation splits: four passes
per client). After one training
round it times `Orchestrator.evaluate` two ways, interleaved over the repeats:

* kept: as the loop runs it, each client personalised on its first pass and restored from a copy on the others;
* every pass: `personalized.KEEP_BYTES = 0`, each pass personalises again (as before the copies were kept).

It counts the `personalize` calls and checks that both ways give the same metrics, bit for bit.

    python bench/personalized_eval.py [--methods fedbabu fedavg_ft pfedfda] [--repeats 3] [--threads N]
                                      [key=value ...]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fl.run.cpu_threads import sleep_at_barriers  # noqa: E402

sleep_at_barriers()  # a run's thread policy (fl/train.py), before torch loads

import torch  # noqa: E402

from bench.harness import orchestrator  # noqa: E402
from fl.config import load_config  # noqa: E402
from fl.core import personalized  # noqa: E402
from fl.core.loop import Orchestrator  # noqa: E402
from fl.core.registry import METHODS, load_plugins  # noqa: E402

WORKLOAD = ["conf=feddrm_cifar10_dir03_synthetic", "data.val_fraction=0.1", "logger.wandb.mode=disabled",
            "logger.progress=false", "logger.partition_plots=false", "trainer.rounds=1", "trainer.eval_every=1"]


def build(tmp: str, method: str, extra: list[str]) -> Orchestrator:
    cfg = load_config([*WORKLOAD, f"method.name={method}", f"logger.output_dir={tmp}", f"data.root={tmp}/data",
                       *extra])
    orch = orchestrator(cfg, Path(tmp) / method)
    orch.run_round(0)  # a trained model to evaluate; this round's own evaluation is not timed
    return orch


def evaluate_once(orch: Orchestrator, keep: bool, calls: list) -> tuple[float, dict, int]:
    """(seconds, metrics, personalize calls) of one evaluation of round 0."""
    before = len(calls)
    with mock.patch.object(personalized, "KEEP_BYTES", personalized.KEEP_BYTES if keep else 0):
        start = time.perf_counter()
        metrics = orch.evaluate(orch.context(0))
        seconds = time.perf_counter() - start
    return seconds, metrics, len(calls) - before


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", nargs="+", default=["fedbabu", "fedavg_ft", "pfedfda"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    p.add_argument("overrides", nargs="*", help="key=value given to every run's config")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load_plugins()
    print(f"{torch.get_num_threads()} torch threads, load average {os.getloadavg()[0]:.2f} at the start")
    print(f"{'method':>10} {'clients':>8} {'mode':>11} {'personalize':>12} {'eval s':>8}  same metrics")
    for method in args.methods:
        cls = METHODS[method].client_cls
        calls: list = []
        original = cls.personalize

        def counted(self, original=original, calls=calls):
            calls.append(self.cid)
            return original(self)

        with tempfile.TemporaryDirectory() as tmp, mock.patch.object(cls, "personalize", counted):
            orch = build(tmp, method, args.overrides)
            times = {True: [], False: []}
            results, counts = {}, {}
            for rep in range(args.repeats):  # interleaved: drift favours neither
                for keep in ((True, False) if rep % 2 == 0 else (False, True)):
                    seconds, results[keep], counts[keep] = evaluate_once(orch, keep, calls)
                    times[keep].append(seconds)
            same = "yes" if results[True] == results[False] else "NO"
            for keep in (True, False):
                print(f"{method:>10} {orch.data.num_clients:>8} {'kept' if keep else 'every pass':>11} "
                      f"{counts[keep]:>12} {statistics.median(times[keep]):>8.2f}  {same}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
