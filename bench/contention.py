"""The quickstart on an idle CPU and beside one competing PyTorch process, interleaved.

The competitor is a plain loop a colleague might leave running: 2 torch threads of 768x768 matmul + tanh at nice 5,
with the environment's OpenMP settings as they were before this process set any (a plain `python`, not fl's entry
point). Each repeat runs the quickstart (`python -m fl.train`, W&B disabled, no progress bar) once alone and once with
the competitor started a second before it and stopped after it, the order alternating between repeats. It prints the
median wall time of each and their ratio (contended / idle).

    python bench/contention.py [--repeats 3] [--against OTHER_CHECKOUT] [--timeout 900] [key=value ...]

--against runs the same quickstarts in another checkout of the project (e.g. `git worktree add /tmp/old <commit>`),
alternating with this one, so both see the same machine; its contended runs can take minutes (issue 35 measured
40x). key=value arguments go to every quickstart. Run it on an otherwise idle machine: the load average is printed
at the start and the end.
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
COMPETITOR = """
import os
os.nice(5)
import torch
torch.set_num_threads(2)
a = torch.randn(768, 768)
while True:
    torch.tanh(a @ a)
"""
# what this process's environment held before anything here set it: the competitor is a plain process
PLAIN_ENV = dict(os.environ)


def quickstart(root: Path, out: Path, name: str, extra: list[str], timeout: float) -> float:
    """Wall seconds of one quickstart in checkout `root`, writing under `out` (its data cache is out's parent's, made
    by the warm-up run); stops the benchmark if it fails."""
    args = [sys.executable, "-m", "fl.train", "logger.wandb.mode=disabled", "logger.progress=false",
            f"logger.output_dir={out}", f"logger.run_name={name}", f"data.root={out.parent / 'data'}", *extra]
    env = {**PLAIN_ENV, "PYTHONPATH": str(root)}
    start = time.perf_counter()
    done = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{root}: quickstart {name}: exit {done.returncode}\n{done.stderr[-1500:]}")
    return wall


def contended(root: Path, out: Path, name: str, extra: list[str], timeout: float) -> float:
    competitor = subprocess.Popen([sys.executable, "-c", COMPETITOR], env=PLAIN_ENV)
    try:
        time.sleep(1.0)  # torch loaded and its threads busy before the quickstart starts
        return quickstart(root, out, name, extra, timeout)
    finally:
        competitor.kill()
        competitor.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--against", type=Path, help="another checkout to time the same quickstarts in")
    p.add_argument("--timeout", type=float, default=900, help="seconds before a quickstart is given up")
    p.add_argument("overrides", nargs="*", help="key=value given to every quickstart")
    args = p.parse_args()
    if args.against is not None and not (args.against / "fl" / "train.py").is_file():
        p.error(f"--against {args.against}: not a checkout of this project (no fl/train.py)")
    roots = [ROOT] + ([args.against.resolve()] if args.against else [])
    given = {k: PLAIN_ENV.get(k, "unset") for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    print(f"load average {os.getloadavg()[0]:.2f} at the start; {os.cpu_count()} CPUs; in the environment: {given}",
          flush=True)
    times: dict[tuple[Path, str], list[float]] = {(r, kind): [] for r in roots for kind in ("idle", "contended")}
    with tempfile.TemporaryDirectory() as tmp:
        for root in roots:  # untimed: the data cache is built, the files are in the page cache
            quickstart(root, Path(tmp) / f"warm-up-{roots.index(root)}", "warm-up", args.overrides, args.timeout)
        for rep in range(args.repeats):
            for i, root in enumerate(roots if rep % 2 == 0 else roots[::-1]):
                for kind in (("idle", "contended") if (rep + i) % 2 == 0 else ("contended", "idle")):
                    run = contended if kind == "contended" else quickstart
                    out = Path(tmp) / f"{rep}-{roots.index(root)}-{kind}"
                    seconds = run(root, out, kind, args.overrides, args.timeout)
                    times[root, kind].append(seconds)
                    print(f"  repeat {rep}  {root}  {kind:9s} {seconds:7.1f} s", flush=True)
    print(f"\n{'checkout':40s} {'idle s':>8} {'contended s':>12} {'ratio':>7}")
    for root in roots:
        idle, busy = statistics.median(times[root, "idle"]), statistics.median(times[root, "contended"])
        print(f"{str(root):40s} {idle:8.1f} {busy:12.1f} {busy / idle:7.2f}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end (the competitor's own load is in it)")


if __name__ == "__main__":
    main()
