"""What W&B costs the quickstart: `python -m fl.train`'s work (bench/fl_phases.py) with W&B offline (the default
without an API key) against W&B disabled, interleaved, the rest at its defaults (progress bar off); median of each
phase over the repeats. The W&B run starts at its first use, in setup's partition_files (the partition's images and
table are its first rows).

    python bench/wandb_cost.py [--repeats 5]
"""
from __future__ import annotations

import argparse
import compileall
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fedavg_overhead import BENCH, PHASES, timed_process  # noqa: E402

MODES = ("offline", "disabled")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    compileall.compile_dir(ROOT / "fl", quiet=1)  # as an installed package is (bench/fedavg_overhead.py)
    print(f"load average {os.getloadavg()[0]:.2f} at the start", flush=True)
    runs = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        def command(mode: str, name: str) -> list[str]:
            return [str(BENCH / "fl_phases.py"), f"logger.wandb.mode={mode}", f"logger.output_dir={tmp}",
                    "logger.progress=false", f"logger.run_name={name}"]

        timed_process(command("disabled", "warm-up"), "warm-up")  # untimed: the data cache is built and read
        for rep in range(args.repeats):
            for mode in MODES if rep % 2 == 0 else MODES[::-1]:  # alternate the order, so drift favours neither
                runs[mode].append(timed_process(command(mode, f"{mode}-{rep}"), mode)[0])
    print(f"the quickstart, median of {args.repeats}:")
    for mode, rows in runs.items():
        median = {k: statistics.median(r[k] for r in rows) for k in (*PHASES, "total")}
        partition = statistics.median(r["setup_parts"]["partition_files"] for r in rows)
        print(f"  W&B {mode:8s} " + "  ".join(f"{k} {median[k]:.2f}" for k in PHASES)
              + f"  = {median['total']:.2f} s   (setup's partition_files {partition:.2f} s)")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
