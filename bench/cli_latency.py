"""How long the command line takes to answer when it does not run anything: `python -m fl.train --help`,
`--list methods`, a method's help, a config error and a missing-data error, each against `python -c "import
torch"` (the floor: every command needs torch). The commands alternate, `--repeats` times each; the table is the
median wall time per command and its ratio to the floor.

    python bench/cli_latency.py [--repeats 5] [--against OTHER_CHECKOUT]

--against times the same commands in another checkout of the project (e.g. `git archive <commit> | tar -x -C /tmp/old`),
alternating with this one, so both columns see the same machine load.

Each command's exit code is checked (0 for help and listings, 2 for the errors), so a command that fails for
another reason than the one timed stops the benchmark instead of timing a traceback.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MISSING = str(Path(tempfile.gettempdir()) / "fl-cli-latency-no-such-file.npz")
COMMANDS = {  # name -> (arguments after `python`, expected exit code)
    "import torch": (["-c", "import torch"], 0),
    "--help": (["-m", "fl.train", "--help"], 0),
    "--list methods": (["-m", "fl.train", "--list", "methods"], 0),
    "method help": (["-m", "fl.train", "method.name=fedprox", "--help"], 0),
    "config error": (["-m", "fl.train", "trainer.rounds=0"], 2),
    "missing-data error": (["-m", "fl.train", "data.name=arrays", f"data.root={MISSING}"], 2),
    "fl.sweep --help": (["-m", "fl.sweep", "--help"], 0),
}


def time_once(root: Path, args: list[str], expected: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(root)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=root, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != expected:
        raise SystemExit(f"{root}: python {' '.join(args)}: exit {done.returncode}, expected {expected}\n"
                         f"{done.stderr[-800:]}")
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs of each command (alternating)")
    parser.add_argument("--against", type=Path, help="another checkout to time the same commands in")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.against is not None and not (args.against / "fl" / "train.py").is_file():
        parser.error(f"--against {args.against}: not a checkout of this project (no fl/train.py)")
    roots = [ROOT] + ([args.against.resolve()] if args.against else [])
    times: dict[tuple[Path, str], list[float]] = {(root, name): [] for root in roots for name in COMMANDS}
    for _ in range(args.repeats):
        for name, (argv, expected) in COMMANDS.items():
            for root in roots:
                times[root, name].append(time_once(root, argv, expected))
    for root in roots:
        floor = statistics.median(times[root, "import torch"])
        print(f"{root}\n{'command':20s}  {'median s':>8s}  {'min s':>6s}  {'max s':>6s}  {'/ import torch':>14s}")
        for name in COMMANDS:
            walls = times[root, name]
            med = statistics.median(walls)
            print(f"{name:20s}  {med:8.2f}  {min(walls):6.2f}  {max(walls):6.2f}  {med / floor:14.2f}")
    print(f"({args.repeats} runs each, alternating; python {sys.version.split()[0]})")


if __name__ == "__main__":
    main()
