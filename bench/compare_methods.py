"""Run a config under several methods and seeds, then print mean ± std of chosen summary metrics.

    python bench/compare_methods.py conf=fedpals_synthetic methods=fedavg,fedpals seeds=0,1,2 \
        metrics=test/target_acc [key=value ...]

Each run is a normal `python -m fl.train` run (W&B disabled) under outputs/compare/<conf>/; the table
reports the final value and, when the run has a target validation set, the value at the best
validation round (the paper's model selection). A metric a method does not report (e.g. routing
accuracy for a method without a router) is left out of that method's rows.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    opts = dict(a.split("=", 1) for a in argv if a.split("=", 1)[0] in ("conf", "methods", "seeds", "metrics"))
    extra = [a for a in argv if a.split("=", 1)[0] not in opts]
    conf, methods = opts["conf"], opts.get("methods", "fedavg").split(",")
    seeds = [int(s) for s in opts.get("seeds", "0,1,2").split(",")]
    metrics = opts.get("metrics", "test/acc_mean_clients").split(",")
    out = Path("outputs") / "compare" / Path(conf).stem
    rows = []
    for method in methods:
        for seed in seeds:
            name = f"{method}-s{seed}"
            summary = out / name / "summary.json"
            if not summary.is_file():
                cmd = [sys.executable, "-m", "fl.train", f"conf={conf}", f"method.name={method}", f"seed={seed}",
                       f"data.partition.seed={seed}", "logger.wandb.mode=disabled", "logger.progress=false",
                       f"logger.output_dir={out}", f"logger.run_name={name}", *extra]
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            rows.append((method, seed, json.loads(summary.read_text())))
    print(f"{conf}: {len(seeds)} seeds {seeds}")
    for metric in metrics:
        for method in methods:
            runs = [s for m, _, s in rows if m == method]
            for label, values in (("final", [s["final"][metric] for s in runs if metric in s["final"]]),
                                  ("at best val", [s["at_best_val"][metric] for s in runs
                                                   if metric in s.get("at_best_val", {})])):
                if values:
                    sd = statistics.stdev(values) if len(values) > 1 else 0.0
                    print(f"  {metric:<24} {method:<10} {label:<12} {statistics.mean(values):.4f} ± {sd:.4f}  "
                          f"({', '.join(f'{v:.3f}' for v in values)})")


if __name__ == "__main__":
    main(sys.argv[1:])
