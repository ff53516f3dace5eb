"""FedACD's missing-class Delta (the paper's "small value", Sec. 3 after Eq. 8) against its Table 9.

Table 9 (CIFAR-100, Dir(beta) for beta = 0.3, 0.1, 0.05): KL(P^m || Q) is 0.83, 0.70, 0.60 for FedACD and
4.06, 4.99, 5.59 for FedAvg, i.e. FedACD far below FedAvg, and falling as beta falls while FedAvg's rises.
This runs FedACD over method.missing_delta x method.p_source (the P behind L2 from the mixed training passes or
from clean ones) and FedAvg on the synthetic twins of those settings, and prints, from the last adaptability
round: test/kl_PQ, server/V_mean, test/absent_mass (the local P rows' mass on classes the client lacks) and
test/acc_global_balanced, then which readings reproduce Table 9's two orderings.

    python bench/fedacd_missing_delta.py [--out DIR] [--deltas 1e-3,1e-2,0.1,1] [key=value ...]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from fl.run.train import main as train

SETTINGS = {"dir03": "fedacd_cifar100_dir03_synthetic", "dir01": "fedacd_cifar100_dir01_synthetic",
            "dir005": "fedacd_cifar100_dir005_synthetic"}  # beta = 0.3, 0.1, 0.05 (Table 9's columns)
KEYS = ("test/kl_PQ", "server/V_mean", "test/absent_mass", "test/acc_global_balanced")


def last_adaptability_row(run_dir: Path) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    row = [r for r in rows if "test/kl_PQ" in r][-1]
    return {k: row.get(k, float("nan")) for k in KEYS}


def run(out: Path, name: str, conf: str, extra: list[str]) -> dict:
    run_dir = out / name
    if not (run_dir / "summary.json").is_file():
        argv = [f"conf={conf}", f"logger.output_dir={out}", f"logger.run_name={name}", "logger.wandb.mode=disabled",
                "logger.progress=false", "fabric.cpu_threads=1", *extra]
        assert train(argv) == 0, name
    return last_adaptability_row(run_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="outputs/bench/fedacd_missing_delta")
    parser.add_argument("--deltas", default="1e-3,1e-2,0.1,1")
    parser.add_argument("overrides", nargs="*", help="key=value for every run")
    args = parser.parse_args()
    out, deltas = Path(args.out), args.deltas.split(",")
    readings = [("fedavg", None, None)] + [("fedacd", d, s) for s in ("mixed", "clean") for d in deltas]
    table: dict[tuple, dict[str, dict]] = {}
    for setting, conf in SETTINGS.items():
        for method, delta, source in readings:
            extra = [f"method.name={method}"] + ([f"method.missing_delta={delta}", f"method.p_source={source}"]
                                                 if method == "fedacd" else [])
            name = f"{setting}-{method}" + (f"-d{delta}-{source}" if delta else "")
            table.setdefault((method, delta, source), {})[setting] = run(out, name, conf, extra + args.overrides)

    print(f"{'reading':28s}" + "".join(f"{s:>34s}" for s in SETTINGS))
    print(f"{'':28s}" + "   KL(P||Q)  V_mean  absent  g_acc" * len(SETTINGS))
    for (method, delta, source), by_setting in table.items():
        label = method if delta is None else f"fedacd delta={delta} P={source}"
        print(f"{label:28s}" + "".join(f"{r[KEYS[0]]:11.3f}{r[KEYS[1]]:8.3f}{r[KEYS[2]]:8.3f}{r[KEYS[3]]:7.3f}"
                                       for r in by_setting.values()))
    fedavg = [table[("fedavg", None, None)][s]["test/kl_PQ"] for s in SETTINGS]
    print(f"\nFedAvg's KL rises as beta falls (Table 9): {fedavg[0] < fedavg[1] < fedavg[2]}")
    for (method, delta, source), by_setting in table.items():
        if method != "fedacd":
            continue
        kl = [by_setting[s]["test/kl_PQ"] for s in SETTINGS]
        below = all(a < b for a, b in zip(kl, fedavg))
        falls = kl[0] > kl[1] > kl[2]
        print(f"delta={delta:>5s} P={source:5s}: below FedAvg in every column {below}; falls as beta falls {falls}")


if __name__ == "__main__":
    main()
