"""What keeps FedACD's local probability mass on the classes a client lacks (issue 46, item 4), on its CIFAR-100
Dir(0.1) twin: each of FedACD's two local losses and its mixup switched off in turn, against FedAvg.

FedACD's local loss is L1 + lambda L2 (Eq. 9). L1 (Eq. 7) is KL(p || q), q = p with the off-target mass spread
evenly over all C - 1 other classes, those the client lacks included; L2 (Eq. 8) is cross-entropy on logits shifted by
log Delta, with Delta_yk "a small value" for a missing class k, which takes k out of L2's softmax denominator.
KL(P^m || Q) (Table 9) charges every unit of a P row's off-diagonal mass about -log((1 - tau) / (C - 1)) = 16 nats.
The ablations here are measurements, not methods of the paper: "without L1" replaces L1 by 0 in FedACD's
training_step (a patch in this process).

    python bench/fedacd_absent_mass.py [--out DIR] [--seed 0] [key=value ...]

Prints, from each run's last adaptability round: test/kl_PQ, test/absent_mass (the local P rows' mass on classes the
client lacks), and test/acc_global_balanced. The figures are in bench/README.md.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import fl.methods.fedacd as fedacd
from fl.core import registry
from fl.run.train import main as train
from fl.sweep.warm_worker import isolated

CONF = "fedacd_cifar100_dir01_synthetic"
KEYS = ("test/kl_PQ", "test/absent_mass", "test/acc_global_balanced")
READINGS = {  # name -> (overrides, L1 on)
    "FedAvg": (["method.name=fedavg"], True),
    "FedACD (Delta 1e-3, mixup)": ([], True),
    "FedACD, Delta 1 (missing classes kept in L2)": (["method.missing_delta=1.0"], True),
    "FedACD without L1": ([], False),
    "FedACD without L1, Delta 1": (["method.missing_delta=1.0"], False),
    "FedACD without mixup": (["method.mixup=false"], True),
}


def last_adaptability_row(run_dir: Path) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    row = [r for r in rows if "test/kl_PQ" in r][-1]
    return {k: row.get(k, float("nan")) for k in KEYS}


def run(out: Path, name: str, extra: list[str], l1: bool) -> dict:
    run_dir = out / name
    if not (run_dir / "summary.json").is_file():
        argv = [f"conf={CONF}", f"logger.output_dir={out}", f"logger.run_name={name}", "logger.wandb.mode=disabled",
                "logger.progress=false", "fabric.cpu_threads=1", *extra]
        flatten = fedacd.l1_flatten
        if not l1:
            fedacd.l1_flatten = lambda logp, y: torch.zeros_like(logp[:, 0])
        try:
            with isolated():
                assert train(argv) == 0, name
        finally:
            fedacd.l1_flatten = flatten
    return last_adaptability_row(run_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="outputs/bench/fedacd_absent_mass")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("overrides", nargs="*", help="key=value for every run")
    args = parser.parse_args()
    out = Path(args.out)
    registry.load_plugins()  # before the first run: each run restores the registry it found (warm_worker.isolated)
    print("| reading | KL(P‖Q) | absent mass | balanced accuracy |\n|---|---|---|---|")
    for i, (label, (extra, l1)) in enumerate(READINGS.items()):
        r = run(out, f"r{i}-s{args.seed}", [*extra, f"seed={args.seed}", *args.overrides], l1)
        print(f"| {label} | {r[KEYS[0]]:.3f} | {r[KEYS[1]]:.3f} | {r[KEYS[2]]:.3f} |", flush=True)


if __name__ == "__main__":
    main()
